/* Allreduce over N ranks (threads, each with its own communicator, over TCP on 127.0.0.1):
 * every rank must hold the same bytes, within float32 rounding of a float64 reference sum,
 * for 1..5 ranks, counts 0, 1, < N, not divisible by N, large; float32/16/bf16/64, int32/64;
 * sum, avg, max, min; ring and recursive doubling; in place and not; several stripes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_wk.h"
#include "testutil.h"

typedef struct ar_case {
    size_t count;
    fl_dtype_t dtype;
    fl_op_t op;
    bool in_place;
    int repeats;
    /* results, one buffer per rank, compared after the threads join */
    void **out;
    int world;
} ar_case_t;

/* Rank r's input element i, as a double before conversion to the dtype. */
static double input(int r, size_t i, uint64_t salt)
{
    uint64_t s = salt ^ ((uint64_t)r << 40) ^ (uint64_t)i * 0x9e3779b97f4a7c15ULL;
    return fl_test_uniform(&s) * 100.0;
}

static void store(void *buf, size_t i, fl_dtype_t dt, double v)
{
    switch (dt) {
    case FL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case FL_FLOAT64: ((double *)buf)[i] = v; break;
    case FL_FLOAT16: ((uint16_t *)buf)[i] = fl_f32_to_f16((float)v); break;
    case FL_BFLOAT16: ((uint16_t *)buf)[i] = fl_f32_to_bf16((float)v); break;
    case FL_INT32: ((int32_t *)buf)[i] = (int32_t)lround(v); break;
    case FL_INT64: ((int64_t *)buf)[i] = (int64_t)llround(v) * 1000003LL; break;
    default: break;
    }
}

static double load(const void *buf, size_t i, fl_dtype_t dt)
{
    switch (dt) {
    case FL_FLOAT32: return ((const float *)buf)[i];
    case FL_FLOAT64: return ((const double *)buf)[i];
    case FL_FLOAT16: return fl_f16_to_f32(((const uint16_t *)buf)[i]);
    case FL_BFLOAT16: return fl_bf16_to_f32(((const uint16_t *)buf)[i]);
    case FL_INT32: return ((const int32_t *)buf)[i];
    case FL_INT64: return (double)((const int64_t *)buf)[i];
    default: return NAN;
    }
}

static int ar_rank(fl_comm_t *comm, void *arg)
{
    ar_case_t *c = arg;
    int r = fl_comm_rank(comm);
    size_t esz = fl_dtype_size(c->dtype);
    void *in = malloc(c->count * esz + 1);
    void *out = malloc(c->count * esz + 1);
    ck_assert(in != NULL && out != NULL);
    int rc = FL_OK;
    for (int k = 0; k < c->repeats && rc == FL_OK; k++) {
        for (size_t i = 0; i < c->count; i++)
            store(in, i, c->dtype, input(r, i, (uint64_t)k));
        if (c->in_place) {
            memcpy(out, in, c->count * esz);
            rc = fl_allreduce(comm, out, out, c->count, c->dtype, c->op);
        } else {
            memset(out, 0xAB, c->count * esz);
            rc = fl_allreduce(comm, in, out, c->count, c->dtype, c->op);
            /* The input must come back untouched. */
            for (size_t i = 0; rc == FL_OK && i < c->count; i++) {
                uint8_t want[8];
                store(want, 0, c->dtype, input(r, i, (uint64_t)k));
                if (memcmp((uint8_t *)in + i * esz, want, esz) != 0)
                    ck_abort_msg("rank %d: input element %zu changed", r, i);
            }
        }
    }
    free(in);
    c->out[r] = out;
    return rc;
}

/* Checks the last repeat's results: identical across ranks, close to the float64 reference. */
static void ar_check(ar_case_t *c)
{
    size_t esz = fl_dtype_size(c->dtype);
    int k = c->repeats - 1;
    for (int r = 1; r < c->world; r++)
        if (memcmp(c->out[0], c->out[r], c->count * esz) != 0)
            ck_abort_msg("rank %d's result differs from rank 0's", r);
    for (size_t i = 0; i < c->count; i++) {
        double ref = 0;
        double mag = 0;
        for (int r = 0; r < c->world; r++) {
            /* The reference starts from what each rank actually held (after conversion). */
            double v;
            uint8_t tmp[8];
            store(tmp, 0, c->dtype, input(r, i, (uint64_t)k));
            v = load(tmp, 0, c->dtype);
            if (c->op == FL_MAX)
                ref = r == 0 ? v : fmax(ref, v);
            else if (c->op == FL_MIN)
                ref = r == 0 ? v : fmin(ref, v);
            else
                ref += v;
            mag += fabs(v);
        }
        if (c->op == FL_AVG) {
            ref /= c->world;
            mag /= c->world;
        }
        double got = load(c->out[0], i, c->dtype);
        double tol;
        switch (c->dtype) {
        case FL_FLOAT32: tol = (c->world + 1) * 6e-8 * mag; break;
        case FL_FLOAT64: tol = (c->world + 1) * 1.2e-16 * mag; break;
        case FL_FLOAT16: tol = (c->world + 1) * 6e-8 * mag + fabs(ref) * 4.9e-4 + 6e-8; break;
        case FL_BFLOAT16: tol = (c->world + 1) * 6e-8 * mag + fabs(ref) * 3.9e-3 + 1e-38; break;
        default: tol = 0; break;
        }
        /* Check writes a checkpoint for every passing ck_assert: test in C, abort on failure. */
        if (!(fabs(got - ref) <= tol))
            ck_abort_msg("element %zu of %zu (%s %s, %d ranks): got %.17g expected %.17g "
                         "(tol %.3g)",
                         i, c->count, fl_dtype_name(c->dtype), fl_op_name(c->op), c->world, got,
                         ref, tol);
    }
}

static void run_case(int world, size_t count, fl_dtype_t dt, fl_op_t op, bool in_place,
                     const fl_comm_opts_t *tweak)
{
    ar_case_t c = {count, dt, op, in_place, 2, NULL, world};
    c.out = calloc((size_t)world, sizeof *c.out);
    char err[1024] = "";
    fl_comm_opts_t o;
    const fl_comm_opts_t *base = NULL;
    if (tweak != NULL) {
        o = *tweak;
        base = &o;
    }
    int rc = fl_test_run_ranks(world, base, ar_rank, &c, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%d ranks, %zu x %s %s: %s", world, count, fl_dtype_name(dt),
                  fl_op_name(op), err);
    ar_check(&c);
    for (int r = 0; r < world; r++)
        free(c.out[r]);
    free(c.out);
}

static void opts_with(fl_comm_opts_t *o, fl_algo_t algo, size_t segment, int stripes)
{
    fl_comm_opts_init(o);
    o->host = "127.0.0.1";
    o->timeout_ms = 20000;
    o->rendezvous_timeout_ms = 20000;
    o->log_level = FL_LOG_ERROR;
    o->algo = algo;
    o->segment_bytes = segment;
    o->stripes = stripes;
}

/* Sizes that hit the edges for `world` ranks. */
static const size_t edge_counts[] = {0, 1, 2, 3, 4, 5, 7, 1000, 1001, 4099};

START_TEST(test_ring_edges_f32)
{
    int world = _i + 1;
    fl_comm_opts_t o;
    opts_with(&o, FL_ALGO_RING, 4096, 1);
    for (size_t k = 0; k < sizeof edge_counts / sizeof edge_counts[0]; k++)
        run_case(world, edge_counts[k], FL_FLOAT32, FL_SUM, k % 2 == 0, &o);
}
END_TEST

START_TEST(test_rd_edges_f32)
{
    int world = _i + 1;
    fl_comm_opts_t o;
    opts_with(&o, FL_ALGO_RD, 4096, 1);
    for (size_t k = 0; k < sizeof edge_counts / sizeof edge_counts[0]; k++)
        run_case(world, edge_counts[k], FL_FLOAT32, FL_AVG, k % 2 == 1, &o);
}
END_TEST

START_TEST(test_direct_edges)
{
    int world = _i + 1;
    fl_comm_opts_t o;
    opts_with(&o, FL_ALGO_DIRECT, 4096, 1);
    for (size_t k = 0; k < sizeof edge_counts / sizeof edge_counts[0]; k++)
        run_case(world, edge_counts[k], FL_FLOAT32, k % 3 == 0 ? FL_MAX : FL_AVG, k % 2 == 1, &o);
}
END_TEST

START_TEST(test_dtypes_ops)
{
    static const fl_dtype_t dts[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16,
                                     FL_FLOAT64, FL_INT32,   FL_INT64};
    static const fl_op_t ops[] = {FL_SUM, FL_AVG, FL_MAX, FL_MIN};
    fl_comm_opts_t o;
    static const fl_algo_t algos[] = {FL_ALGO_RING, FL_ALGO_RD, FL_ALGO_DIRECT};
    for (int a = 0; a < 3; a++) {
        opts_with(&o, algos[a], 4096, 1);
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (size_t p = 0; p < sizeof ops / sizeof ops[0]; p++)
                if (fl_op_supports(ops[p], dts[d]))
                    run_case(3, 3001, dts[d], ops[p], (d + p) % 2 == 0, &o);
    }
}
END_TEST

START_TEST(test_large_ring)
{
    fl_comm_opts_t o;
    opts_with(&o, FL_ALGO_AUTO, (size_t)256 << 10, 1);
    run_case(4, (size_t)3 << 20 | 7, FL_FLOAT32, FL_AVG, true, &o);
    run_case(3, (size_t)1 << 20, FL_BFLOAT16, FL_SUM, false, &o);
}
END_TEST

START_TEST(test_stripes)
{
    fl_comm_opts_t o;
    opts_with(&o, FL_ALGO_RING, 8192, 3);
    run_case(4, 100003, FL_FLOAT32, FL_SUM, true, &o);
    run_case(2, 77777, FL_FLOAT16, FL_AVG, false, &o);
}
END_TEST

START_TEST(test_auto_picks_by_size)
{
    fl_comm_opts_t o;
    opts_with(&o, FL_ALGO_AUTO, 65536, 1);
    o.small_bytes = 4096;
    run_case(4, 1024, FL_FLOAT32, FL_SUM, true, &o); /* 4 KiB: recursive doubling */
    run_case(4, 1025, FL_FLOAT32, FL_SUM, true, &o); /* one more: ring */
}
END_TEST

/* The drill's exactly representable data: the ring's float32 sum must be exact. */
static int exact_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    size_t n = 300007;
    float *buf = malloc(n * sizeof *buf);
    int rc = FL_OK;
    for (int step = 0; step < 3 && rc == FL_OK; step++) {
        fl_wk_drill_fill(buf, n, FL_FLOAT32, fl_comm_rank(comm), step);
        rc = fl_allreduce(comm, buf, buf, n, FL_FLOAT32, FL_SUM);
        for (size_t i = 0; rc == FL_OK && i < n; i++)
            if (buf[i] != (float)fl_wk_drill_expected(i, fl_comm_size(comm), step, FL_SUM))
                ck_abort_msg("element %zu: %.9g", i, buf[i]);
    }
    free(buf);
    return rc;
}

START_TEST(test_exact_sums)
{
    fl_comm_opts_t o;
    opts_with(&o, FL_ALGO_RING, 16384, 2);
    char err[512] = "";
    ck_assert_msg(fl_test_run_ranks(5, &o, exact_rank, NULL, err, sizeof err) == FL_OK, "%s", err);
}
END_TEST

Suite *allreduce_suite(void);
Suite *allreduce_suite(void)
{
    Suite *s = suite_create("allreduce");
    TCase *t = tcase_create("edges");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_ring_edges_f32, 0, 5);
    tcase_add_loop_test(t, test_rd_edges_f32, 0, 5);
    tcase_add_loop_test(t, test_direct_edges, 0, 5);
    suite_add_tcase(s, t);
    t = tcase_create("types");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_dtypes_ops);
    tcase_add_test(t, test_auto_picks_by_size);
    tcase_add_test(t, test_exact_sums);
    suite_add_tcase(s, t);
    t = tcase_create("large");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_large_ring);
    tcase_add_test(t, test_stripes);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(allreduce_suite());
}
