/* Reduce-scatter, all-gather, broadcast and barrier over 1..5 ranks (threads, each with its own
 * communicator, on 127.0.0.1 or ipc://) against serial references, and a long random mix of
 * every collective with ranks running ahead of each other (up to 9 ranks). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collutil.h"

#define GUARD 32
#define CANARY 0xA5

/* The first wrong result of a rank that keeps going: a rank that stops early leaves its peers
 * waiting for their deadline, which hides the cause and slows the suite down. */
typedef struct first_bad {
    int rc;
    char text[900];
} first_bad_t;

/* True when the rank may go on: rc is FL_OK or a wrong result (remembered), not a failed call. */
static bool go_on(first_bad_t *f, int rc)
{
    if (rc == TEST_EBAD && f->rc == FL_OK) {
        f->rc = rc;
        snprintf(f->text, sizeof f->text, "%s", fl_last_error());
    }
    return rc == FL_OK || rc == TEST_EBAD;
}

static int first_result(const first_bad_t *f)
{
    return f->rc == FL_OK ? FL_OK : fl_fail(f->rc, "%s", f->text);
}

static bool guard_intact(const uint8_t *p)
{
    for (size_t i = 0; i < GUARD; i++)
        if (p[i] != CANARY)
            return false;
    return true;
}

/* Rank r's input element i, before conversion to the dtype. */
static double fval(int r, size_t i, uint64_t salt)
{
    uint64_t s = salt ^ ((uint64_t)(r + 1) << 40) ^ (uint64_t)i * 0x9e3779b97f4a7c15ULL;
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
    case FL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int)lround(v); break;
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
    case FL_UINT8: return ((const uint8_t *)buf)[i];
    default: return NAN;
    }
}

/* ---- reduce-scatter ---- */

typedef enum rs_mode {
    RS_SEPARATE, /* recvbuf is its own buffer of exactly the shard's size */
    RS_AT_SHARD, /* recvbuf is this rank's shard inside sendbuf (in place, as NCCL) */
} rs_mode_t;

static const char *const rs_mode_name[] = {"separate", "at-shard"};

static int rs_verify(int r, int n, const void *got, size_t count, fl_dtype_t dt, fl_op_t op,
                     uint64_t salt, rs_mode_t mode)
{
    size_t off = fl_shard_offset(count, n, r);
    size_t mine = fl_shard_count(count, n, r);
    for (size_t j = 0; j < mine; j++) {
        double ref = 0;
        double mag = 0;
        for (int q = 0; q < n; q++) {
            uint8_t t[8];
            store(t, 0, dt, fval(q, off + j, salt));
            ref += load(t, 0, dt);
            mag += fabs(load(t, 0, dt));
        }
        if (op == FL_AVG) {
            ref /= n;
            mag /= n;
        }
        double tol = (n + 1) * 6e-8 * mag + fabs(ref) * 1.2e-7;
        if (dt == FL_FLOAT16)
            tol += fabs(ref) * 4.9e-4 + 6e-8;
        double g = load(got, j, dt);
        if (!(fabs(g - ref) <= tol))
            return bad("rank %d of %d: reduce-scatter %zu x %s %s (%s): element %zu: got %.9g, "
                       "want %.9g (tol %.3g)",
                       r, n, count, fl_dtype_name(dt), fl_op_name(op), rs_mode_name[mode], off + j,
                       g, ref, tol);
    }
    return FL_OK;
}

static int rs_one(fl_comm_t *comm, size_t count, fl_dtype_t dt, fl_op_t op, rs_mode_t mode,
                  uint64_t salt)
{
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    size_t esz = fl_dtype_size(dt);
    size_t off = fl_shard_offset(count, n, r);
    size_t mine = fl_shard_count(count, n, r);
    uint8_t *send = malloc(count * esz + GUARD);
    uint8_t *copy = malloc(count * esz + GUARD);
    uint8_t *sep = malloc(mine * esz + GUARD);
    if (send == NULL || copy == NULL || sep == NULL)
        return bad("out of memory");
    for (size_t i = 0; i < count; i++)
        store(send, i, dt, fval(r, i, salt));
    memset(send + count * esz, CANARY, GUARD);
    memcpy(copy, send, count * esz);
    memset(sep, CANARY, mine * esz + GUARD);
    uint8_t *recv = mode == RS_SEPARATE ? sep : send + off * esz;
    int rc = fl_reduce_scatter(comm, send, recv, count, dt, op);
    if (rc == FL_OK)
        rc = rs_verify(r, n, recv, count, dt, op, salt, mode);
    if (rc == FL_OK && !guard_intact(send + count * esz))
        rc = bad("rank %d: reduce-scatter %zu (%s) wrote past sendbuf", r, count,
                 rs_mode_name[mode]);
    if (rc == FL_OK && mode == RS_SEPARATE && !guard_intact(sep + mine * esz))
        rc = bad("rank %d: reduce-scatter %zu wrote past the %zu-element recvbuf", r, count, mine);
    if (rc == FL_OK && mode == RS_SEPARATE && memcmp(send, copy, count * esz) != 0)
        rc = bad("rank %d: reduce-scatter %zu changed sendbuf", r, count);
    free(send);
    free(copy);
    free(sep);
    return rc;
}

static const struct {
    fl_dtype_t dt;
    fl_op_t op;
} rs_types[] = {{FL_FLOAT32, FL_SUM},
                {FL_FLOAT32, FL_AVG},
                {FL_FLOAT16, FL_SUM},
                {FL_FLOAT16, FL_AVG}};

static int rs_rank(fl_comm_t *comm, void *arg)
{
    const int *modes = arg; /* RS_ modes, ending with -1 */
    int n = fl_comm_size(comm);
    size_t counts[] = {0, 1, (size_t)n - 1, (size_t)1000 * n + 3, 100003};
    uint64_t salt = 1;
    first_bad_t f = {FL_OK, ""};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (size_t t = 0; t < sizeof rs_types / sizeof rs_types[0]; t++) {
            for (int m = 0; modes[m] >= 0; m++) {
                int rc = rs_one(comm, counts[c], rs_types[t].dt, rs_types[t].op,
                                (rs_mode_t)modes[m], salt++);
                if (!go_on(&f, rc))
                    return rc;
            }
        }
    }
    return first_result(&f);
}

START_TEST(test_reduce_scatter)
{
    int modes[] = {RS_SEPARATE, RS_AT_SHARD, -1};
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 16384;
    run_world(_i + 1, &o, rs_rank, modes);
}
END_TEST

/* recvbuf == sendbuf, the shard written to its start: the buffer's first elements are this
 * rank's contribution to chunk 0, which the ring may still be reading or sending from. */
/* recvbuf overlapping sendbuf anywhere but at this rank's shard would read data it already
 * overwrote: every rank is refused with FL_EINVAL before the collective starts (so no rank
 * waits for another), and the communicator works afterwards. */
static int rs_overlap_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    size_t count = (size_t)1000 * n + 3;
    size_t off = fl_shard_offset(count, n, r);
    float *send = calloc(count, sizeof *send);
    if (send == NULL)
        return bad("out of memory");
    /* Rank 0's shard starts at element 0, so its bad pointer is one element in. */
    float *recv = off > 0 ? send : send + 1;
    int rc = fl_reduce_scatter(comm, send, recv, count, FL_FLOAT32, FL_SUM);
    free(send);
    if (rc != FL_EINVAL)
        return bad("rank %d: overlapping reduce-scatter returned %d, expected FL_EINVAL", r, rc);
    if (strstr(fl_last_error(), "overlap") == NULL)
        return bad("rank %d: detail does not say the buffers overlap: %s", r, fl_last_error());
    int modes[] = {RS_AT_SHARD, -1};
    return rs_rank(comm, modes);
}

START_TEST(test_reduce_scatter_same_pointer)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 16384;
    o.timeout_ms = 3000;
    char err[1024] = "";
    int world = _i + 2;
    int rc = fl_test_run_ranks(world, &o, rs_overlap_rank, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%d ranks: %s", world, err);
}
END_TEST

/* ---- all-gather ---- */

static uint64_t gbits(int owner, size_t i, uint64_t salt)
{
    uint64_t s = salt * 1315423911ULL ^ ((uint64_t)(owner + 1) << 48) ^ i;
    return fl_test_rand(&s);
}

/* Element i as contributed by its shard's owner; every rank can compute it. */
static void gput(void *buf, size_t i, fl_dtype_t dt, int owner, uint64_t salt)
{
    uint64_t b = gbits(owner, i, salt);
    if (dt == FL_UINT8) {
        ((uint8_t *)buf)[i] = (uint8_t)b;
    } else if (dt == FL_FLOAT64) {
        ((double *)buf)[i] = (double)(int64_t)b / 3.0;
    } else {
        uint32_t w = (uint32_t)b;
        memcpy((uint8_t *)buf + i * 4, &w, 4);
    }
}

static int ag_one(fl_comm_t *comm, size_t count, fl_dtype_t dt, bool in_place, uint64_t salt)
{
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    size_t esz = fl_dtype_size(dt);
    size_t off = fl_shard_offset(count, n, r);
    size_t mine = fl_shard_count(count, n, r);
    uint8_t *recv = malloc(count * esz + GUARD);
    uint8_t *want = malloc(count * esz + 1);
    uint8_t *shard = malloc(mine * esz + 1);
    if (recv == NULL || want == NULL || shard == NULL)
        return bad("out of memory");
    memset(recv, 0xEE, count * esz);
    memset(recv + count * esz, CANARY, GUARD);
    for (int q = 0; q < n; q++) {
        size_t o0 = fl_shard_offset(count, n, q);
        for (size_t i = o0; i < o0 + fl_shard_count(count, n, q); i++)
            gput(want, i, dt, q, salt);
    }
    const uint8_t *send = shard;
    if (in_place) {
        memcpy(recv + off * esz, want + off * esz, mine * esz);
        send = recv + off * esz;
    } else {
        memcpy(shard, want + off * esz, mine * esz);
    }
    int rc = fl_allgather(comm, send, recv, count, dt);
    if (rc == FL_OK && memcmp(recv, want, count * esz) != 0) {
        size_t i = 0;
        while (memcmp(recv + i * esz, want + i * esz, esz) == 0)
            i++;
        int owner = 0;
        while (owner + 1 < n && fl_shard_offset(count, n, owner + 1) <= i)
            owner++;
        rc = bad("rank %d of %d: all-gather %zu x %s (%s): element %zu (shard of rank %d) "
                 "differs",
                 r, n, count, fl_dtype_name(dt), in_place ? "in place" : "separate", i, owner);
    }
    if (rc == FL_OK && !guard_intact(recv + count * esz))
        rc = bad("rank %d: all-gather %zu wrote past recvbuf", r, count);
    if (rc == FL_OK && !in_place && memcmp(shard, want + off * esz, mine * esz) != 0)
        rc = bad("rank %d: all-gather %zu changed sendbuf", r, count);
    free(recv);
    free(want);
    free(shard);
    return rc;
}

static int ag_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int n = fl_comm_size(comm);
    size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n + 1, (size_t)1000 * n + 3, 77777, 300001};
    static const fl_dtype_t dts[] = {FL_UINT8, FL_FLOAT64, FL_FLOAT32};
    uint64_t salt = 1;
    first_bad_t f = {FL_OK, ""};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            for (int p = 0; p < 2; p++) {
                int rc = ag_one(comm, counts[c], dts[d], p == 1, salt++);
                if (!go_on(&f, rc))
                    return rc;
            }
        }
    }
    return first_result(&f);
}

START_TEST(test_allgather)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 8192;
    o.stripes = _i % 2 + 1;
    run_world(_i + 1, &o, ag_rank, NULL);
}
END_TEST

/* ---- broadcast ---- */

static int bcast_one(fl_comm_t *comm, size_t count, fl_dtype_t dt, int root, uint64_t salt)
{
    int r = fl_comm_rank(comm);
    size_t esz = fl_dtype_size(dt);
    uint8_t *buf = malloc(count * esz + GUARD);
    uint8_t *want = malloc(count * esz + 1);
    if (buf == NULL || want == NULL)
        return bad("out of memory");
    for (size_t i = 0; i < count; i++)
        gput(want, i, dt, root, salt);
    if (r == root)
        memcpy(buf, want, count * esz);
    else
        memset(buf, 0x5A ^ r, count * esz);
    memset(buf + count * esz, CANARY, GUARD);
    int rc = fl_broadcast(comm, buf, count, dt, root);
    if (rc == FL_OK && memcmp(buf, want, count * esz) != 0) {
        size_t i = 0;
        while (memcmp(buf + i * esz, want + i * esz, esz) == 0)
            i++;
        rc = bad("rank %d: broadcast of %zu x %s from root %d: element %zu differs", r, count,
                 fl_dtype_name(dt), root, i);
    }
    if (rc == FL_OK && !guard_intact(buf + count * esz))
        rc = bad("rank %d: broadcast %zu wrote past buf", r, count);
    free(buf);
    free(want);
    return rc;
}

static int bcast_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    /* 64 KiB is small_bytes: up to it a tree, above it a chain of 4 KiB segments. */
    static const struct {
        size_t count;
        fl_dtype_t dt;
    } cases[] = {{0, FL_FLOAT32},      {1, FL_UINT8},       {1, FL_FLOAT64},
                 {1000, FL_UINT8},     {16384, FL_FLOAT32}, {16385, FL_FLOAT32},
                 {300001, FL_FLOAT32}, {70001, FL_FLOAT64}};
    uint64_t salt = 1;
    first_bad_t f = {FL_OK, ""};
    for (int root = 0; root < fl_comm_size(comm); root++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int rc = bcast_one(comm, cases[c].count, cases[c].dt, root, salt++);
            if (!go_on(&f, rc))
                return rc;
        }
    }
    return first_result(&f);
}

START_TEST(test_broadcast)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 4096;
    run_world(_i + 1, &o, bcast_rank, NULL);
}
END_TEST

/* ---- barrier ---- */

typedef struct bar_arg {
    int slow[2];
    int64_t entry[2][MAX_WORLD];
    int64_t exit[2][MAX_WORLD];
} bar_arg_t;

static int bar_rank(fl_comm_t *comm, void *arg)
{
    bar_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    for (int k = 0; k < 2; k++) {
        if (r == a->slow[k])
            usleep(300 * 1000);
        a->entry[k][r] = fl_now_ns();
        int rc = fl_barrier(comm);
        a->exit[k][r] = fl_now_ns();
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

START_TEST(test_barrier)
{
    int world = _i + 1;
    bar_arg_t a;
    memset(&a, 0, sizeof a);
    a.slow[0] = world - 1;
    a.slow[1] = 0;
    fl_comm_opts_t o;
    opts_base(&o);
    run_world(world, &o, bar_rank, &a);
    for (int k = 0; k < 2; k++) {
        int64_t slow_in = a.entry[k][a.slow[k]];
        for (int r = 0; r < world; r++) {
            if (a.exit[k][r] < slow_in)
                ck_abort_msg("%d ranks, round %d: rank %d left the barrier %.3f ms before "
                             "rank %d entered it",
                             world, k, r, (double)(slow_in - a.exit[k][r]) / 1e6, a.slow[k]);
            if (r != a.slow[k] && a.exit[k][r] - a.entry[k][r] < 100 * 1000000LL)
                ck_abort_msg("%d ranks, round %d: rank %d waited only %.3f ms for rank %d", world,
                             k, r, (double)(a.exit[k][r] - a.entry[k][r]) / 1e6, a.slow[k]);
        }
    }
}
END_TEST

/* ---- a long random mix ---- */

typedef struct mix_arg {
    uint64_t seed;
    int iters;
} mix_arg_t;

/* Small integers: every sum, average and conversion below is exact in every type used. */
static int ival(uint64_t salt, int r, size_t i)
{
    uint64_t s = salt ^ ((uint64_t)(r + 1) << 44) ^ (uint64_t)i * 0x9e3779b97f4a7c15ULL;
    return (int)(fl_test_rand(&s) % 17) - 8;
}

/* The exact reduction of element i over n ranks, in dt. */
static double mix_ref(fl_dtype_t dt, fl_op_t op, uint64_t salt, int n, size_t i)
{
    int acc = ival(salt, 0, i);
    for (int q = 1; q < n; q++) {
        int v = ival(salt, q, i);
        acc = op == FL_MAX ? (v > acc ? v : acc) : op == FL_MIN ? (v < acc ? v : acc) : acc + v;
    }
    if (op != FL_AVG)
        return acc;
    float q = (float)acc / (float)n;
    return dt == FL_FLOAT16 ? fl_f16_to_f32(fl_f32_to_f16(q)) : q;
}

static int mix_rank(fl_comm_t *comm, void *arg)
{
    const mix_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    uint64_t common = a->seed; /* the same on every rank: what to call, with which sizes */
    uint64_t own = a->seed ^ ((uint64_t)(r + 1) * 0x5851f42d4c957f2dULL); /* delays */
    size_t cap = 40000;
    uint8_t *buf = malloc(cap * 8 + GUARD);
    uint8_t *out = malloc(cap * 8 + GUARD);
    if (buf == NULL || out == NULL)
        return bad("out of memory");
    static const fl_dtype_t red_dts[] = {FL_FLOAT32, FL_INT32, FL_FLOAT16};
    static const fl_op_t red_ops[] = {FL_SUM, FL_MAX, FL_MIN, FL_AVG};
    static const fl_dtype_t mov_dts[] = {FL_UINT8, FL_FLOAT32, FL_FLOAT64};
    int rc = FL_OK;
    first_bad_t f = {FL_OK, ""};
    for (int it = 0; it < a->iters && go_on(&f, rc); it++) {
        int kind = (int)(fl_test_rand(&common) % 5);
        uint64_t sz = fl_test_rand(&common) % 10;
        size_t count = (size_t)(fl_test_rand(&common) % (sz < 5 ? 64 : sz < 8 ? 3000 : cap));
        fl_dtype_t rdt = red_dts[fl_test_rand(&common) % 3];
        fl_op_t op = red_ops[fl_test_rand(&common) % (rdt == FL_INT32 ? 3 : 4)];
        fl_dtype_t mdt = mov_dts[fl_test_rand(&common) % 3];
        int root = (int)(fl_test_rand(&common) % (uint64_t)n);
        bool in_place = fl_test_rand(&common) & 1;
        uint64_t salt = (uint64_t)it * 7919 + a->seed;
        if (fl_test_rand(&own) % 6 == 0)
            usleep((useconds_t)(fl_test_rand(&own) % 3000));
        size_t off = fl_shard_offset(count, n, r);
        size_t mine = fl_shard_count(count, n, r);
        if (kind == 0 || kind == 1) {
            for (size_t i = 0; i < count; i++)
                store(buf, i, rdt, ival(salt, r, i));
            size_t esz = fl_dtype_size(rdt);
            uint8_t *dst = in_place ? (kind == 0 ? buf : buf + off * esz) : out;
            if (kind == 0)
                rc = fl_allreduce(comm, buf, dst, count, rdt, op);
            else
                rc = fl_reduce_scatter(comm, buf, dst, count, rdt, op);
            size_t first = kind == 0 ? 0 : off;
            size_t len = kind == 0 ? count : mine;
            for (size_t j = 0; rc == FL_OK && j < len; j++) {
                double want = mix_ref(rdt, op, salt, n, first + j);
                if (load(dst, j, rdt) != want)
                    rc =
                        bad("iteration %d: rank %d: %s %zu x %s %s: element %zu is %g, want "
                            "%g",
                            it, r, kind == 0 ? "allreduce" : "reduce-scatter", count,
                            fl_dtype_name(rdt), fl_op_name(op), first + j, load(dst, j, rdt), want);
            }
        } else if (kind == 2 || kind == 3) {
            size_t esz = fl_dtype_size(mdt);
            uint8_t *want = buf;
            for (int q = 0; q < n; q++) {
                size_t o0 = kind == 2 ? fl_shard_offset(count, n, q) : 0;
                size_t c0 = kind == 2 ? fl_shard_count(count, n, q) : count;
                for (size_t i = o0; i < o0 + c0; i++)
                    gput(want, i, mdt, kind == 2 ? q : root, salt);
            }
            if (kind == 2) {
                memset(out, 0xEE, count * esz);
                if (in_place)
                    memcpy(out + off * esz, want + off * esz, mine * esz);
                rc = fl_allgather(comm, in_place ? out + off * esz : want + off * esz, out, count,
                                  mdt);
            } else {
                if (r == root)
                    memcpy(out, want, count * esz);
                else
                    memset(out, 0x11, count * esz);
                rc = fl_broadcast(comm, out, count, mdt, root);
            }
            if (rc == FL_OK && memcmp(out, want, count * esz) != 0)
                rc = bad("iteration %d: rank %d: %s of %zu x %s (root %d) differs", it, r,
                         kind == 2 ? "all-gather" : "broadcast", count, fl_dtype_name(mdt), root);
        } else {
            rc = fl_barrier(comm);
        }
    }
    if (go_on(&f, rc))
        rc = first_result(&f);
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    if (rc == FL_OK && st.ops != (uint64_t)a->iters)
        rc = bad("rank %d: %llu ops counted after %d collectives", r, (unsigned long long)st.ops,
                 a->iters);
    if (rc == FL_OK && st.bad_msgs != 0)
        rc = bad("rank %d: %llu messages refused", r, (unsigned long long)st.bad_msgs);
    free(buf);
    free(out);
    return rc;
}

START_TEST(test_random_mix)
{
    static const struct {
        int world;
        int stripes;
        int iters;
        fl_algo_t algo;
    } cfg[] = {{4, 1, 300, FL_ALGO_AUTO},
               {3, 2, 300, FL_ALGO_RD},
               {5, 1, 200, FL_ALGO_AUTO},
               {2, 3, 300, FL_ALGO_AUTO},
               {9, 1, 100, FL_ALGO_AUTO}};
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 4096;
    o.small_bytes = 2048;
    o.stripes = cfg[_i].stripes;
    o.algo = cfg[_i].algo;
    mix_arg_t a = {0x1234567ULL + (uint64_t)_i, cfg[_i].iters};
    run_world(cfg[_i].world, &o, mix_rank, &a);
}
END_TEST

Suite *collectives_ops_suite(void);
Suite *collectives_ops_suite(void)
{
    Suite *s = suite_create("collectives_ops");
    TCase *t = tcase_create("reduce_scatter");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_reduce_scatter, 0, 5);
    tcase_add_loop_test(t, test_reduce_scatter_same_pointer, 0, 4);
    suite_add_tcase(s, t);
    t = tcase_create("allgather");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_allgather, 0, 5);
    suite_add_tcase(s, t);
    t = tcase_create("broadcast");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_broadcast, 0, 5);
    suite_add_tcase(s, t);
    t = tcase_create("barrier");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_barrier, 0, 5);
    suite_add_tcase(s, t);
    t = tcase_create("random_mix");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_random_mix, 0, 5);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(collectives_ops_suite());
}
