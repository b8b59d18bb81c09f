/* Reduce-scatter, all-gather, broadcast and barrier over 1..5 ranks (threads, each with its own
 * communicator, on 127.0.0.1 or ipc://) against serial references; a long random mix of every
 * collective with ranks running ahead of each other (up to 9 ranks); mismatched calls (order,
 * count, root, dtype) and argument errors with their codes and texts; the op and byte counters
 * and the algorithm AUTO picks. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define MAX_WORLD 16
#define GUARD 32
#define CANARY 0xA5
#define TEST_EBAD (-100) /* a rank found a wrong result; the detail says what */

static int bad(const char *fmt, ...) FL_PRINTF(1, 2);
static int bad(const char *fmt, ...)
{
    char text[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return fl_fail(TEST_EBAD, "%s", text);
}

static void opts_base(fl_comm_opts_t *o)
{
    fl_comm_opts_init(o);
    o->host = "127.0.0.1";
    o->timeout_ms = 10000;
    o->rendezvous_timeout_ms = 20000;
    o->log_level = FL_LOG_ERROR;
}

typedef struct rank_slot {
    fl_comm_opts_t opts;
    char bind[128];
    fl_test_rank_fn fn;
    void *arg;
    int rc;
    char err[1024];
} rank_slot_t;

static void *rank_main(void *p)
{
    rank_slot_t *s = p;
    fl_comm_t *comm = NULL;
    s->rc = fl_comm_init(&s->opts, &comm);
    if (s->rc == FL_OK)
        s->rc = s->fn(comm, s->arg);
    if (s->rc != FL_OK)
        snprintf(s->err, sizeof s->err, "%s", fl_last_error());
    fl_comm_destroy(&comm);
    return NULL;
}

/* Runs fn on world ranks: threads with their own communicators and an in-process coordinator.
 * ipc_tag != NULL: rank r's data endpoint is ipc:///tmp/flodl-coll-<pid>-<tag>-<r>. Fails the
 * test listing every rank's error, wrong results (TEST_EBAD) first: the other errors are mostly
 * peers of the failed rank running into their deadline. */
/* Called with the coordinator's endpoint before the ranks start, when set (one test per
 * forked process, so a static is enough). */
static void (*before_ranks)(const char *coordinator, const char *job_id);

/* A rank that runs with ipc turned off, when >= 0. */
static int ipc_off_rank = -1;

static void run_world_at(int world, const fl_comm_opts_t *o, const char *ipc_tag,
                         fl_test_rank_fn fn, void *arg)
{
    ck_assert(world >= 1 && world <= MAX_WORLD);
    fl_coord_t *coord = fl_test_coord(world, 0);
    if (before_ranks != NULL)
        before_ranks(fl_coord_endpoint(coord), o->job_id);
    rank_slot_t *slots = calloc((size_t)world, sizeof *slots);
    pthread_t th[MAX_WORLD];
    ck_assert(slots != NULL);
    for (int r = 0; r < world; r++) {
        slots[r].opts = *o;
        slots[r].opts.coordinator = fl_coord_endpoint(coord);
        slots[r].opts.rank = r;
        slots[r].opts.world_size = world;
        if (r == ipc_off_rank)
            slots[r].opts.ipc = 0;
        if (ipc_tag != NULL) {
            snprintf(slots[r].bind, sizeof slots[r].bind, "ipc:///tmp/flodl-coll-%d-%s-%d",
                     (int)getpid(), ipc_tag, r);
            slots[r].opts.bind = slots[r].bind;
        }
        slots[r].fn = fn;
        slots[r].arg = arg;
        ck_assert(pthread_create(&th[r], NULL, rank_main, &slots[r]) == 0);
    }
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    char report[4096] = "";
    size_t len = 0;
    int nfail = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < world; r++) {
            if (slots[r].rc == FL_OK || (slots[r].rc == TEST_EBAD) != (pass == 0))
                continue;
            nfail++;
            if (len < sizeof report)
                len += (size_t)snprintf(report + len, sizeof report - len, "\n  rank %d: %s: %s",
                                        r, fl_strerror(slots[r].rc), slots[r].err);
        }
    }
    for (int r = 0; ipc_tag != NULL && r < world; r++) {
        char path[160];
        unlink(slots[r].bind + strlen("ipc://"));
        for (int k = 1; k < o->stripes; k++) {
            snprintf(path, sizeof path, "%s.%d", slots[r].bind + strlen("ipc://"), k);
            unlink(path);
        }
    }
    free(slots);
    ck_assert_msg(nfail == 0, "%d of %d ranks failed:%s", nfail, world, report);
}

static void run_world(int world, const fl_comm_opts_t *o, fl_test_rank_fn fn, void *arg)
{
    run_world_at(world, o, NULL, fn, arg);
}

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
                       r, n, count, fl_dtype_name(dt), fl_op_name(op), rs_mode_name[mode],
                       off + j, g, ref, tol);
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
        rc = bad("rank %d: reduce-scatter %zu wrote past the %zu-element recvbuf", r, count,
                 mine);
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
} rs_types[] = {{FL_FLOAT32, FL_SUM}, {FL_FLOAT32, FL_AVG}, {FL_FLOAT16, FL_SUM},
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
    size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n + 1, (size_t)1000 * n + 3, 77777,
                       300001};
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
    } cases[] = {{0, FL_FLOAT32}, {1, FL_UINT8},       {1, FL_FLOAT64},     {1000, FL_UINT8},
                 {16384, FL_FLOAT32}, {16385, FL_FLOAT32}, {300001, FL_FLOAT32},
                 {70001, FL_FLOAT64}};
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
                ck_abort_msg("%d ranks, round %d: rank %d waited only %.3f ms for rank %d",
                             world, k, r, (double)(a.exit[k][r] - a.entry[k][r]) / 1e6,
                             a.slow[k]);
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
                    rc = bad("iteration %d: rank %d: %s %zu x %s %s: element %zu is %g, want "
                             "%g",
                             it, r, kind == 0 ? "allreduce" : "reduce-scatter", count,
                             fl_dtype_name(rdt), fl_op_name(op), first + j,
                             load(dst, j, rdt), want);
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
                rc = fl_allgather(comm, in_place ? out + off * esz : want + off * esz, out,
                                  count, mdt);
            } else {
                if (r == root)
                    memcpy(out, want, count * esz);
                else
                    memset(out, 0x11, count * esz);
                rc = fl_broadcast(comm, out, count, mdt, root);
            }
            if (rc == FL_OK && memcmp(out, want, count * esz) != 0)
                rc = bad("iteration %d: rank %d: %s of %zu x %s (root %d) differs", it, r,
                         kind == 2 ? "all-gather" : "broadcast", count, fl_dtype_name(mdt),
                         root);
        } else {
            rc = fl_barrier(comm);
        }
    }
    if (go_on(&f, rc))
        rc = first_result(&f);
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    if (rc == FL_OK && st.ops != (uint64_t)a->iters)
        rc = bad("rank %d: %llu ops counted after %d collectives", r,
                 (unsigned long long)st.ops, a->iters);
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
    } cfg[] = {{4, 1, 300, FL_ALGO_AUTO}, {3, 2, 300, FL_ALGO_RD}, {5, 1, 200, FL_ALGO_AUTO},
               {2, 3, 300, FL_ALGO_AUTO}, {9, 1, 100, FL_ALGO_AUTO}};
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

/* ---- mismatched calls ---- */

typedef enum mm_kind {
    MM_ORDER,      /* rank 0 broadcasts while the others allreduce */
    MM_COUNT,      /* rank 0 allreduces 1235 elements, the others 1234 (recursive doubling) */
    MM_COUNT_RING, /* the same with 100001 against 100000 (ring) */
    MM_ROOT,       /* rank 2 broadcasts from root 1, the others from root 0 */
    MM_DTYPE_INT,  /* rank 0 allreduces int32, the others float32 */
    MM_DTYPE_HALF, /* rank 0 allreduces float16, the others float32 */
    MM_BARRIER,    /* rank 0 enters a barrier while the others allreduce */
} mm_kind_t;

typedef struct mm_arg {
    mm_kind_t kind;
    int rc[MAX_WORLD];
    char text[MAX_WORLD][1024];
    int rc2[MAX_WORLD];
    char text2[MAX_WORLD][1024];
} mm_arg_t;

static int mm_rank(fl_comm_t *comm, void *arg)
{
    mm_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    float *buf = calloc(100001, sizeof *buf);
    if (buf == NULL)
        return bad("out of memory");
    int rc = FL_OK;
    switch (a->kind) {
    case MM_ORDER:
        rc = r == 0 ? fl_broadcast(comm, buf, 1000, FL_FLOAT32, 0)
                    : fl_allreduce(comm, buf, buf, 1000, FL_FLOAT32, FL_SUM);
        break;
    case MM_COUNT:
        rc = fl_allreduce(comm, buf, buf, r == 0 ? 1235 : 1234, FL_FLOAT32, FL_SUM);
        break;
    case MM_COUNT_RING:
        rc = fl_allreduce(comm, buf, buf, r == 0 ? 100001 : 100000, FL_FLOAT32, FL_SUM);
        break;
    case MM_ROOT: rc = fl_broadcast(comm, buf, 1000, FL_FLOAT32, r == 2 ? 1 : 0); break;
    case MM_DTYPE_INT:
        rc = fl_allreduce(comm, buf, buf, 1000, r == 0 ? FL_INT32 : FL_FLOAT32, FL_SUM);
        break;
    case MM_DTYPE_HALF:
        rc = fl_allreduce(comm, buf, buf, 1000, r == 0 ? FL_FLOAT16 : FL_FLOAT32, FL_SUM);
        break;
    case MM_BARRIER:
        rc = r == 0 ? fl_barrier(comm) : fl_allreduce(comm, buf, buf, 100, FL_FLOAT32, FL_SUM);
        break;
    }
    a->rc[r] = rc;
    snprintf(a->text[r], sizeof a->text[r], "%s", rc == FL_OK ? "" : fl_last_error());
    if (rc != FL_OK) {
        /* The failure broke the communicator: the next call must say so at once. */
        a->rc2[r] = fl_barrier(comm);
        snprintf(a->text2[r], sizeof a->text2[r], "%s", fl_last_error());
    }
    free(buf);
    return FL_OK;
}

/* Runs a mismatch on world ranks with 1 s deadlines: every rank returns, none with anything but
 * OK / EPROTO / ETIMEDOUT / EPEER; some rank reports EPROTO with all of `must` in its text;
 * every failed rank's next call returns FL_ECLOSED with the original cause. */
static void mm_run(int world, mm_kind_t kind, const char *const *must)
{
    mm_arg_t *a = calloc(1, sizeof *a);
    ck_assert(a != NULL);
    a->kind = kind;
    fl_comm_opts_t o;
    opts_base(&o);
    o.timeout_ms = 1000;
    o.log_level = FL_LOG_OFF;
    int64_t t0 = fl_now_ms();
    run_world(world, &o, mm_rank, a);
    int64_t took = fl_now_ms() - t0;
    char all[2048] = "";
    size_t len = 0;
    int found = -1;
    for (int r = 0; r < world; r++) {
        len += (size_t)snprintf(all + len, len < sizeof all ? sizeof all - len : 0,
                                " [rank %d: %s: %.200s]", r, fl_strerror(a->rc[r]),
                                a->text[r]);
        if (len >= sizeof all)
            len = sizeof all - 1;
        int rc = a->rc[r];
        if (rc != FL_OK && rc != FL_EPROTO && rc != FL_ETIMEDOUT && rc != FL_EPEER)
            ck_abort_msg("mismatch %d, %d ranks: rank %d returned %d (%s): %s", kind, world, r,
                         rc, fl_strerror(rc), a->text[r]);
        bool names_all = rc == FL_EPROTO;
        for (int k = 0; must[k] != NULL; k++)
            names_all = names_all && strstr(a->text[r], must[k]) != NULL;
        if (names_all && found < 0)
            found = r;
        if (rc != FL_OK && a->rc2[r] != FL_ECLOSED)
            ck_abort_msg("mismatch %d: rank %d's call after the failure returned %d (%s): %s",
                         kind, r, a->rc2[r], fl_strerror(a->rc2[r]), a->text2[r]);
        if (rc != FL_OK && (strstr(a->text2[r], "broken by an earlier failure") == NULL ||
                            strstr(a->text2[r], a->text[r]) == NULL))
            ck_abort_msg("mismatch %d: rank %d's FL_ECLOSED text '%s' does not carry the cause "
                         "'%s'",
                         kind, r, a->text2[r], a->text[r]);
    }
    ck_assert_msg(found >= 0, "mismatch %d, %d ranks: no rank reported FL_EPROTO naming "
                  "'%s'%s%s:%s",
                  kind, world, must[0], must[1] ? ", " : "", must[1] ? must[1] : "", all);
    /* Blocked ranks give up at their 1 s deadline; setup and teardown take the rest. */
    ck_assert_msg(took < 10000, "mismatch %d, %d ranks took %lld ms", kind, world,
                  (long long)took);
    free(a);
}

START_TEST(test_mismatch_order)
{
    static const char *const must[] = {"different order", "broadcast", "allreduce", NULL};
    mm_run(_i + 2, MM_ORDER, must);
}
END_TEST

START_TEST(test_mismatch_count)
{
    static const char *const small[] = {"1235", "1234", NULL};
    static const char *const large[] = {"100001", "100000", NULL};
    mm_run(3, MM_COUNT, small);
    mm_run(2, MM_COUNT, small);
    mm_run(4, MM_COUNT_RING, large);
}
END_TEST

START_TEST(test_mismatch_root)
{
    static const char *const must[] = {"root 0", "root", NULL};
    mm_run(3, MM_ROOT, must);
}
END_TEST

START_TEST(test_mismatch_barrier)
{
    static const char *const must[] = {"barrier", "allreduce", NULL};
    mm_run(3, MM_BARRIER, must);
}
END_TEST

START_TEST(test_mismatch_dtype_int)
{
    static const char *const must[] = {"int32", "float32", NULL};
    mm_run(2, MM_DTYPE_INT, must);
}
END_TEST

/* float16 and float32 both send float32 partial sums: only a dtype check in the header can
 * tell them apart. */
START_TEST(test_mismatch_dtype_half)
{
    static const char *const must[] = {"float16", NULL};
    mm_run(2, MM_DTYPE_HALF, must);
}
END_TEST

/* ---- argument errors ---- */

static int expect_einval(int rc, const char *call, const char *a, const char *b)
{
    const char *t = fl_last_error();
    if (rc != FL_EINVAL)
        return bad("%s returned %d (%s), want FL_EINVAL; detail '%s'", call, rc,
                   fl_strerror(rc), t);
    if (strstr(t, a) == NULL || (b != NULL && strstr(t, b) == NULL))
        return bad("%s: detail '%s' does not name '%s' and '%s'", call, t, a, b ? b : "");
    return FL_OK;
}

#define EXPECT_EINVAL(call, a, b)                                                             \
    do {                                                                                      \
        int rc_ = expect_einval((call), #call, (a), (b));                                     \
        if (rc_ != FL_OK)                                                                     \
            return rc_;                                                                       \
    } while (0)

#define EXPECT_OK(call)                                                                       \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ != FL_OK)                                                                     \
            return rc_ == TEST_EBAD ? rc_ : bad("%s: %s: %s", #call, fl_strerror(rc_),        \
                                                fl_last_error());                             \
    } while (0)

static int args_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    float buf[64];
    float out[64];
    int32_t ibuf[64];
    uint8_t ubuf[64];
    char me[32];
    char top[32];
    memset(ibuf, 0, sizeof ibuf);
    memset(ubuf, 0, sizeof ubuf);
    for (int i = 0; i < 64; i++)
        buf[i] = (float)(r + i);
    snprintf(me, sizeof me, "rank %d", r);
    snprintf(top, sizeof top, "root %d", n);

    EXPECT_EINVAL(fl_allreduce(comm, buf, buf, 10, (fl_dtype_t)99, FL_SUM), "unknown dtype 99",
                  me);
    EXPECT_EINVAL(fl_allgather(comm, buf, buf, 10, (fl_dtype_t)0), "unknown dtype 0", me);
    EXPECT_EINVAL(fl_broadcast(comm, buf, 10, (fl_dtype_t)-3, 0), "unknown dtype -3", me);
    EXPECT_EINVAL(fl_allreduce(comm, ibuf, ibuf, 10, FL_INT32, FL_AVG), "avg", "int32");
    EXPECT_EINVAL(fl_reduce_scatter(comm, ibuf, ibuf, 10, FL_INT32, FL_AVG), "avg", "int32");
    EXPECT_EINVAL(fl_allreduce(comm, ubuf, ubuf, 10, FL_UINT8, FL_MAX), "max", "uint8");
    EXPECT_EINVAL(fl_allreduce(comm, buf, buf, 10, FL_FLOAT32, (fl_op_t)9), "operator",
                  "float32");
    EXPECT_EINVAL(fl_broadcast(comm, buf, 10, FL_FLOAT32, -1), "root -1", "out of range");
    EXPECT_EINVAL(fl_broadcast(comm, buf, 10, FL_FLOAT32, n), top, "out of range");
    EXPECT_EINVAL(fl_allreduce(comm, NULL, buf, 10, FL_FLOAT32, FL_SUM), "NULL buffer",
                  "10 elements");
    EXPECT_EINVAL(fl_allreduce(comm, buf, NULL, 10, FL_FLOAT32, FL_SUM), "NULL buffer", me);
    EXPECT_EINVAL(fl_reduce_scatter(comm, NULL, buf, 64, FL_FLOAT32, FL_SUM), "NULL buffer",
                  "reduce-scatter");
    EXPECT_EINVAL(fl_reduce_scatter(comm, buf, NULL, 64, FL_FLOAT32, FL_SUM), "NULL recvbuf",
                  "reduce-scatter");
    EXPECT_EINVAL(fl_allgather(comm, NULL, buf, 64, FL_FLOAT32), "NULL sendbuf", "all-gather");
    EXPECT_EINVAL(fl_allgather(comm, buf, NULL, 64, FL_FLOAT32), "NULL buffer", "all-gather");
    EXPECT_EINVAL(fl_broadcast(comm, NULL, 5, FL_FLOAT32, 0), "NULL buffer", "broadcast");
    EXPECT_EINVAL(fl_allreduce(comm, buf, buf, SIZE_MAX / 8 + 1, FL_FLOAT32, FL_SUM),
                  "too large", me);

    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    if (st.ops != 0)
        return bad("rank %d: %llu ops counted after refused calls only", r,
                   (unsigned long long)st.ops);

    /* NULL is fine where no element would be touched. */
    EXPECT_OK(fl_allreduce(comm, NULL, NULL, 0, FL_FLOAT32, FL_SUM));
    EXPECT_OK(fl_reduce_scatter(comm, NULL, NULL, 0, FL_FLOAT32, FL_SUM));
    EXPECT_OK(fl_allgather(comm, NULL, NULL, 0, FL_FLOAT32));
    EXPECT_OK(fl_broadcast(comm, NULL, 0, FL_FLOAT32, n - 1));
    /* One element: only rank 0 has a shard, the others may pass NULL for theirs. */
    out[0] = -1;
    EXPECT_OK(fl_reduce_scatter(comm, buf, r == 0 ? out : NULL, 1, FL_FLOAT32, FL_SUM));
    if (r == 0 && out[0] != (float)(n * (n - 1) / 2))
        return bad("reduce-scatter of one element: %g, want %d", out[0], n * (n - 1) / 2);
    out[0] = -1;
    EXPECT_OK(fl_allgather(comm, r == 0 ? buf : NULL, out, 1, FL_FLOAT32));
    if (out[0] != 0.0f)
        return bad("rank %d: all-gather of one element: %g, want 0", r, out[0]);

    /* The communicator still works. */
    EXPECT_OK(fl_allreduce(comm, buf, out, 64, FL_FLOAT32, FL_SUM));
    for (int i = 0; i < 64; i++)
        if (out[i] != (float)(n * i + n * (n - 1) / 2))
            return bad("rank %d: allreduce after refused calls: element %d is %g", r, i,
                       out[i]);
    fl_comm_get_stats(comm, &st);
    if (st.ops != 7)
        return bad("rank %d: %llu ops counted, want 7", r, (unsigned long long)st.ops);
    return FL_OK;
}

START_TEST(test_argument_errors)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.log_level = FL_LOG_OFF;
    run_world(_i + 1, &o, args_rank, NULL);
}
END_TEST

/* ---- counters ---- */

typedef struct st_arg {
    uint64_t sent[MAX_WORLD];
    uint64_t recv[MAX_WORLD];
} st_arg_t;

/* Elements rank r sends in the ring's reduce-scatter and/or all-gather. */
static uint64_t ring_elems(int r, int n, size_t count, bool rs, bool ag)
{
    uint64_t e = 0;
    for (int s = 0; s < n - 1; s++) {
        if (rs)
            e += fl_shard_count(count, n, fl_ring_rs_send_chunk(r, s, n));
        if (ag)
            e += fl_shard_count(count, n, fl_ring_ag_send_chunk(r, s, n));
    }
    return e;
}

/* Checks a call's result and that bytes_sent moved by exactly sent, with the algorithm and op
 * count given. bytes_recv is left to test_stats_early_messages: messages that arrive before
 * their collective starts (a neighbour running ahead) make it timing-dependent here. */
static int st_step(fl_comm_t *comm, int rc, const fl_comm_stats_t *before, uint64_t sent,
                   fl_algo_t algo, uint64_t ops, const char *what)
{
    if (rc != FL_OK)
        return bad("%s: %s: %s", what, fl_strerror(rc), fl_last_error());
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    int r = fl_comm_rank(comm);
    if (st.bytes_sent - before->bytes_sent != sent)
        return bad("rank %d: %s sent %llu bytes, want %llu", r, what,
                   (unsigned long long)(st.bytes_sent - before->bytes_sent),
                   (unsigned long long)sent);
    if (st.last_algo != algo)
        return bad("rank %d: after %s last_algo is %d, want %d", r, what, (int)st.last_algo,
                   (int)algo);
    if (st.ops != ops || st.bad_msgs != 0)
        return bad("rank %d: after %s ops %llu (want %llu), bad_msgs %llu", r, what,
                   (unsigned long long)st.ops, (unsigned long long)ops,
                   (unsigned long long)st.bad_msgs);
    return FL_OK;
}

/* Bytes rank r sends in a small allreduce of b bytes: one-shot sends b to each peer; recursive
 * doubling over P = 2^k <= N ranks sends b per round, plus the fold-in (even ranks below
 * 2(N-P)) or the hand-out (odd ranks below 2(N-P)). */
static uint64_t small_sent(fl_algo_t algo, int r, int n, uint64_t b)
{
    if (algo == FL_ALGO_DIRECT)
        return (uint64_t)(n - 1) * b;
    int p = 1;
    int rounds = 0;
    while (p * 2 <= n) {
        p *= 2;
        rounds++;
    }
    int rem = n - p;
    if (r < 2 * rem)
        return r % 2 == 0 ? b : (uint64_t)(rounds + 1) * b;
    return (uint64_t)rounds * b;
}

static int st_rank(fl_comm_t *comm, void *arg)
{
    st_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    size_t c = 10007;
    float *buf = malloc(c * sizeof *buf);
    float *out = malloc(c * sizeof *out);
    uint16_t *half = calloc(c, sizeof *half);
    if (buf == NULL || out == NULL || half == NULL)
        return bad("out of memory");
    for (size_t i = 0; i < c; i++)
        buf[i] = (float)(r + 1);
    fl_comm_stats_t s;
    fl_comm_get_stats(comm, &s);
    int rc = FL_OK;
    if (s.ops != 0 || s.bytes_sent != 0 || s.bytes_recv != 0 || s.bad_msgs != 0 ||
        s.last_algo != FL_ALGO_AUTO)
        rc = bad("rank %d: fresh counters are not zero / AUTO", r);
    uint64_t rs_out = ring_elems(r, n, c, true, false);
    uint64_t ag_out = ring_elems(r, n, c, false, true);
    /* Up to small_bytes (4 KiB here) AUTO runs one-shot on up to 8 ranks, recursive doubling
     * on more; above it the ring. */
    fl_algo_t small = n <= 8 ? FL_ALGO_DIRECT : FL_ALGO_RD;
    if (rc == FL_OK) {
        rc = st_step(comm, fl_allreduce(comm, buf, out, 1024, FL_FLOAT32, FL_SUM), &s,
                     small_sent(small, r, n, 4096), small, 1, "4 KiB allreduce");
        if (rc == FL_OK && out[1023] != (float)(n * (n + 1) / 2))
            rc = bad("rank %d: 4 KiB allreduce gave %g", r, out[1023]);
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_allreduce(comm, buf, out, c, FL_FLOAT32, FL_SUM), &s,
                     (rs_out + ag_out) * 4, FL_ALGO_RING, 2, "float32 ring allreduce");
        fl_comm_stats_t t;
        fl_comm_get_stats(comm, &t);
        a->sent[r] = t.bytes_sent - s.bytes_sent;
        if (rc == FL_OK && out[c - 1] != (float)(n * (n + 1) / 2))
            rc = bad("rank %d: ring allreduce gave %g", r, out[c - 1]);
    }
    /* float16: float32 partial sums in the reduce-scatter, float16 in the all-gather. */
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_allreduce(comm, half, half, c, FL_FLOAT16, FL_SUM), &s,
                     rs_out * 4 + ag_out * 2, FL_ALGO_RING, 3, "float16 ring allreduce");
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_allreduce(comm, buf, out, 100, FL_FLOAT32, FL_MAX), &s,
                     small_sent(small, r, n, 400), small, 4, "400-byte allreduce");
    }
    /* Reduce-scatter and all-gather are not allreduces: last_algo stays. */
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_reduce_scatter(comm, buf, out, c, FL_FLOAT32, FL_SUM), &s,
                     rs_out * 4, small, 5, "reduce-scatter");
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm,
                     fl_allgather(comm, buf + fl_shard_offset(c, n, r), buf, c, FL_FLOAT32), &s,
                     ag_out * 4, small, 6, "all-gather");
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_barrier(comm), &s, 0, small, 7, "barrier");
    }
    free(buf);
    free(out);
    free(half);
    return rc;
}

START_TEST(test_stats)
{
    static const int worlds[] = {2, 3, 4, 5, 9};
    int world = worlds[_i];
    st_arg_t a;
    memset(&a, 0, sizeof a);
    fl_comm_opts_t o;
    opts_base(&o);
    o.small_bytes = 4096;
    o.segment_bytes = 4096;
    run_world(world, &o, st_rank, &a);
    uint64_t sent = 0;
    for (int r = 0; r < world; r++)
        sent += a.sent[r];
    /* Each of the N chunks is sent N-1 times in each phase: 2(N-1)/N of the buffer per rank. */
    uint64_t want = 2ULL * (uint64_t)(world - 1) * 10007 * 4;
    ck_assert_msg(sent == want, "%d ranks: ring allreduce of %d bytes sent %llu in total, want "
                  "%llu",
                  world, 10007 * 4, (unsigned long long)sent, (unsigned long long)want);
}
END_TEST

/* Rank 2 arrives late to a broadcast that rank 3 waits on (tree: 0 -> 2 -> 3), so rank 1's
 * second-round message of the following recursive-doubling allreduce (partners 0, then 3)
 * reaches rank 3 early and is stashed. Every payload byte sent is received by someone. */
static int stash_rank(fl_comm_t *comm, void *arg)
{
    st_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    float buf[256];
    for (int i = 0; i < 256; i++)
        buf[i] = r == 0 ? (float)i : -1.0f;
    if (r == 2)
        usleep(300 * 1000);
    EXPECT_OK(fl_broadcast(comm, buf, 256, FL_FLOAT32, 0));
    EXPECT_OK(fl_allreduce(comm, buf, buf, 256, FL_FLOAT32, FL_SUM));
    for (int i = 0; i < 256; i++)
        if (buf[i] != (float)(4 * i))
            return bad("rank %d: element %d is %g, want %d", r, i, buf[i], 4 * i);
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    a->sent[r] = st.bytes_sent;
    a->recv[r] = st.bytes_recv;
    return FL_OK;
}

START_TEST(test_stats_early_messages)
{
    st_arg_t a;
    memset(&a, 0, sizeof a);
    fl_comm_opts_t o;
    opts_base(&o);
    o.algo = FL_ALGO_RD; /* the schedule the comment above relies on */
    run_world(4, &o, stash_rank, &a);
    /* Broadcast: ranks 1..3 receive 1 KiB each (rank 0 sends two, rank 2 one); recursive
     * doubling over 4 ranks: everyone sends and receives 2 KiB. */
    static const uint64_t want_sent[4] = {4096, 2048, 3072, 2048};
    static const uint64_t want_recv[4] = {2048, 3072, 3072, 3072};
    for (int r = 0; r < 4; r++) {
        if (a.sent[r] != want_sent[r] || a.recv[r] != want_recv[r])
            ck_abort_msg("rank %d counted %llu bytes sent and %llu received, want %llu and %llu",
                         r, (unsigned long long)a.sent[r], (unsigned long long)a.recv[r],
                         (unsigned long long)want_sent[r], (unsigned long long)want_recv[r]);
    }
}
END_TEST

/* ---- ipc:// data endpoints ---- */

static int ipc_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    static const size_t counts[] = {100, 50001};
    for (size_t k = 0; k < 2; k++) {
        size_t c = counts[k];
        float *buf = malloc(c * sizeof *buf);
        if (buf == NULL)
            return bad("out of memory");
        for (size_t i = 0; i < c; i++)
            buf[i] = (float)(r + (int)(i % 7));
        int rc = fl_allreduce(comm, buf, buf, c, FL_FLOAT32, FL_SUM);
        for (size_t i = 0; rc == FL_OK && i < c; i++)
            if (buf[i] != (float)(n * (n - 1) / 2 + n * (int)(i % 7)))
                rc = bad("rank %d: ipc allreduce of %zu: element %zu is %g", r, c, i, buf[i]);
        if (rc == FL_OK)
            rc = fl_broadcast(comm, buf, c, FL_FLOAT32, n - 1);
        if (rc == FL_OK && buf[c - 1] != (float)(n * (n - 1) / 2 + n * (int)((c - 1) % 7)))
            rc = bad("rank %d: ipc broadcast of %zu differs", r, c);
        free(buf);
        if (rc != FL_OK)
            return rc;
    }
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    if (n > 1 && st.last_algo != FL_ALGO_RING)
        return bad("rank %d: the 200 KB allreduce did not run the ring", r);
    return fl_barrier(comm);
}

START_TEST(test_ipc_endpoints)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 16384;
    o.stripes = _i == 0 ? 1 : 2;
    char tag[16];
    snprintf(tag, sizeof tag, "%d", _i);
    run_world_at(_i == 0 ? 3 : 2, &o, tag, ipc_rank, NULL);
}
END_TEST

/* ---- same-host peers over ipc:// chosen by the communicator ---- */

#define AUTO_SIZES 3
static const size_t auto_counts[AUTO_SIZES] = {1000, 20000, 300001}; /* direct, rd, ring */

typedef struct auto_arg {
    bool ipc;                                  /* what the ranks should use */
    float *out[MAX_WORLD][AUTO_SIZES];         /* each rank's results */
    char dir[MAX_WORLD][128];                  /* each rank's socket directory */
} auto_arg_t;

static int auto_rank(fl_comm_t *comm, void *arg)
{
    auto_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    const char *dir = fl_comm_ipc_dir(comm);
    snprintf(a->dir[r], sizeof a->dir[r], "%s", dir);
    if (a->ipc) {
        struct stat st;
        if (dir[0] == '\0' || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
            (st.st_mode & 0777) != 0700 || st.st_uid != geteuid())
            return bad("rank %d: ipc socket directory '%s' is missing or not private", r, dir);
    } else if (dir[0] != '\0') {
        return bad("rank %d: ipc turned off, yet a socket directory '%s'", r, dir);
    }
    for (int k = 0; k < AUTO_SIZES; k++) {
        size_t c = auto_counts[k];
        float *buf = a->out[r][k];
        /* Magnitudes spread over many binades: any change in the order of the additions
         * would show in the bits. */
        uint64_t x = 0x9E3779B97F4A7C15ULL * (uint64_t)(r + 1) + (uint64_t)k;
        for (size_t i = 0; i < c; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = ldexpf((float)(x % 2001) - 1000.0f, (int)((x >> 20) % 40) - 20);
        }
        int rc = fl_allreduce(comm, buf, buf, c, FL_FLOAT32, FL_SUM);
        if (rc != FL_OK)
            return rc;
        /* The one-shot exchange has opened every peer's socket by now. */
        for (int p = 0; k == 0 && p < n; p++)
            if (p != r && fl_comm_peer_is_ipc(comm, p) != a->ipc)
                return bad("rank %d: data to rank %d over %s, want %s", r, p,
                           a->ipc ? "tcp" : "ipc", a->ipc ? "ipc" : "tcp");
    }
    return fl_barrier(comm);
}

static void auto_run(int world, int stripes, bool ipc, auto_arg_t *a)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.stripes = stripes;
    o.segment_bytes = 65536;
    o.ipc = ipc ? 1 : 0;
    a->ipc = ipc;
    run_world(world, &o, auto_rank, a);
    for (int r = 0; r < world; r++) {
        struct stat st;
        if (a->dir[r][0] != '\0')
            ck_assert_msg(lstat(a->dir[r], &st) != 0, "rank %d's socket directory %s is left",
                          r, a->dir[r]);
    }
}

START_TEST(test_ipc_same_host)
{
    int world = _i == 0 ? 3 : 2;
    int stripes = _i == 0 ? 1 : 2;
    auto_arg_t *on = calloc(1, sizeof *on);
    auto_arg_t *off = calloc(1, sizeof *off);
    ck_assert(on != NULL && off != NULL);
    for (int r = 0; r < world; r++) {
        for (int k = 0; k < AUTO_SIZES; k++) {
            on->out[r][k] = malloc(auto_counts[k] * sizeof(float));
            off->out[r][k] = malloc(auto_counts[k] * sizeof(float));
            ck_assert(on->out[r][k] != NULL && off->out[r][k] != NULL);
        }
    }
    auto_run(world, stripes, true, on);
    auto_run(world, stripes, false, off);
    for (int r = 0; r < world; r++) {
        for (int k = 0; k < AUTO_SIZES; k++) {
            size_t bytes = auto_counts[k] * sizeof(float);
            ck_assert_msg(memcmp(on->out[r][k], on->out[0][k], bytes) == 0,
                          "ipc: rank %d's sum of %zu differs from rank 0's", r, auto_counts[k]);
            ck_assert_msg(memcmp(on->out[r][k], off->out[r][k], bytes) == 0,
                          "rank %d: the sum of %zu over ipc differs from tcp's", r,
                          auto_counts[k]);
        }
    }
    for (int r = 0; r < world; r++) {
        for (int k = 0; k < AUTO_SIZES; k++) {
            free(on->out[r][k]);
            free(off->out[r][k]);
        }
    }
    free(on);
    free(off);
}
END_TEST

/* A socket directory that another user, or a loose mode, could reach is not used: the ranks go
 * over TCP, get the same bits, and leave the directory alone. */
static char open_dir[128];

static void make_open_dir(const char *coordinator, const char *job_id)
{
    fl_comm_ipc_dir_name(job_id, coordinator, open_dir, sizeof open_dir);
    ck_assert_msg(mkdir(open_dir, 0700) == 0 && chmod(open_dir, 0755) == 0, "mkdir %s",
                  open_dir);
}

START_TEST(test_ipc_dir_not_private)
{
    auto_arg_t *a = calloc(1, sizeof *a);
    ck_assert(a != NULL);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            ck_assert((a->out[r][k] = malloc(auto_counts[k] * sizeof(float))) != NULL);
    before_ranks = make_open_dir;
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 65536;
    o.log_level = FL_LOG_OFF; /* the warning saying why is expected */
    a->ipc = false;           /* what the ranks must end up using */
    run_world(2, &o, auto_rank, a);
    before_ranks = NULL;
    struct stat st;
    bool left = lstat(open_dir, &st) == 0 && (st.st_mode & 0777) == 0755;
    rmdir(open_dir);
    ck_assert_msg(left, "%s was changed or removed by ranks that may not use it", open_dir);
    for (int k = 0; k < AUTO_SIZES; k++)
        ck_assert(memcmp(a->out[0][k], a->out[1][k], auto_counts[k] * sizeof(float)) == 0);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            free(a->out[r][k]);
    free(a);
}
END_TEST

/* What a rank killed before fl_comm_destroy leaves (a socket nobody listens on, in its job's
 * directory) is removed by the next communicator of the same user. */
START_TEST(test_ipc_stale_swept)
{
    char dir[128];
    char path[192];
    fl_comm_ipc_dir_name("killed-job", "tcp://127.0.0.1:1", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/r0-p%d.0", dir, (int)getpid());
    ck_assert(mkdir(dir, 0700) == 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    ck_assert(strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    close(fd); /* bound, never listened on: what a killed rank leaves */
    struct timeval old[2] = {{.tv_sec = time(NULL) - 60}, {.tv_sec = time(NULL) - 60}};
    ck_assert(utimes(path, old) == 0 && utimes(dir, old) == 0);
    auto_arg_t *aa = calloc(1, sizeof *aa);
    ck_assert(aa != NULL);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            ck_assert((aa->out[r][k] = malloc(auto_counts[k] * sizeof(float))) != NULL);
    auto_run(2, 1, true, aa);
    struct stat st;
    bool gone = lstat(dir, &st) != 0;
    unlink(path);
    rmdir(dir);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            free(aa->out[r][k]);
    free(aa);
    ck_assert_msg(gone, "%s, left by a killed rank, is still there", dir);
}
END_TEST

/* One rank with ipc off: its links go over TCP both ways, the others' over ipc. */
static int mixed_rank(fl_comm_t *comm, void *arg)
{
    float *out = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    float buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = ldexpf((float)((r * 7919 + i * 104729) % 2001) - 1000.0f, (i * 13 + r) % 40 - 20);
    int rc = fl_allreduce(comm, buf, buf, 1000, FL_FLOAT32, FL_SUM);
    if (rc != FL_OK)
        return rc;
    memcpy(out + (size_t)r * 1000, buf, sizeof buf);
    for (int p = 0; p < n; p++) {
        bool want = r != ipc_off_rank && p != ipc_off_rank;
        if (p != r && fl_comm_peer_is_ipc(comm, p) != want)
            return bad("rank %d: data to rank %d over %s, want %s", r, p, want ? "tcp" : "ipc",
                       want ? "ipc" : "tcp");
    }
    return fl_barrier(comm);
}

START_TEST(test_ipc_one_rank_off)
{
    static float out[3 * 1000];
    fl_comm_opts_t o;
    opts_base(&o);
    ipc_off_rank = 1;
    run_world(3, &o, mixed_rank, out);
    ipc_off_rank = -1;
    for (int r = 1; r < 3; r++)
        ck_assert_msg(memcmp(out, out + r * 1000, 1000 * sizeof(float)) == 0,
                      "rank %d's sum differs from rank 0's", r);
}
END_TEST

Suite *collectives_suite(void);
Suite *collectives_suite(void)
{
    Suite *s = suite_create("collectives");
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
    t = tcase_create("mismatch");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_mismatch_order, 0, 4);
    tcase_add_test(t, test_mismatch_count);
    tcase_add_test(t, test_mismatch_root);
    tcase_add_test(t, test_mismatch_barrier);
    tcase_add_test(t, test_mismatch_dtype_int);
    tcase_add_test(t, test_mismatch_dtype_half);
    suite_add_tcase(s, t);
    t = tcase_create("arguments");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_argument_errors, 0, 3);
    suite_add_tcase(s, t);
    t = tcase_create("stats");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_stats, 0, 5);
    tcase_add_test(t, test_stats_early_messages);
    suite_add_tcase(s, t);
    t = tcase_create("ipc");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_ipc_endpoints, 0, 2);
    tcase_add_loop_test(t, test_ipc_same_host, 0, 2);
    tcase_add_test(t, test_ipc_dir_not_private);
    tcase_add_test(t, test_ipc_stale_swept);
    tcase_add_test(t, test_ipc_one_rank_off);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(collectives_suite());
}
