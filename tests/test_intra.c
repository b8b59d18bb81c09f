/* The intra-host collectives (collective/fl_intra.h) against a serial host reference: built as
 * test_intra for cpu (host and copy implementations) and sim (copy, with and without jitter),
 * label device; and as test_intra_gpu (label gpu) for cuda, NCCL over 1 GPU and over every
 * GPU when there are several, and copies between two logical devices on GPU 0; that build
 * skips, saying why, without a GPU (fails with FLODL_REQUIRE_GPU=1) or without NCCL. For L in
 * 1..4 and counts not divisible by L: reduce-scatter (sum, avg), all-gather and broadcast give
 * the reference's bits (NCCL over several GPUs: within float rounding), the padding stays
 * zero, shards a device does not own are left alone; done events chain the next streams; a
 * failure on one device is reported naming the host, the device and the operation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_intra.h"
#include "testutil.h"

#define MAXL 4

typedef struct cfg {
    fl_dev_kind_t kind;
    fl_intra_impl_t impl;
    int jitter_us;
    bool same_gpu; /* cuda: every logical device on GPU 0 */
} cfg_t;

#ifdef INTRA_TEST_CUDA
static const cfg_t cfgs[] = {{FL_DEV_CUDA, FL_INTRA_NCCL, 0, false},
                             {FL_DEV_CUDA, FL_INTRA_COPY, 0, true}};
#else
static const cfg_t cfgs[] = {{FL_DEV_CPU, FL_INTRA_HOST, 0, false},
                             {FL_DEV_CPU, FL_INTRA_COPY, 0, false},
                             {FL_DEV_SIM, FL_INTRA_COPY, 0, false},
                             {FL_DEV_SIM, FL_INTRA_COPY, 300, false}};
#endif
#define NCFGS ((int)(sizeof cfgs / sizeof cfgs[0]))

#define OK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == FL_OK, "%s: %s: %s", #call, fl_strerror(rc_), fl_last_error());       \
    } while (0)

typedef struct bench {
    cfg_t c;
    int L;
    fl_dev_t *d[MAXL];
    fl_stream_t *st[MAXL]; /* the collectives' */
    fl_stream_t *cs[MAXL]; /* compute: the producers */
    fl_stream_t *cp[MAXL]; /* copies: the consumers */
    fl_event_t *done[MAXL];
    fl_event_t *ev[MAXL];
    fl_dptr_t buf[MAXL];
    size_t cap; /* floats of each buf */
    fl_intra_t *x;
} bench_t;

/* How many devices cfg can have here (0: none; the reason printed). */
static int usable(const cfg_t *c, int L)
{
#ifdef INTRA_TEST_CUDA
    if (c->impl == FL_INTRA_NCCL && !fl_intra_nccl_built()) {
        printf("SKIP: the NCCL cases: NCCL not built in\n");
        return 0;
    }
    if (!c->same_gpu && fl_dev_count(FL_DEV_CUDA, NULL, 0) < L) {
        printf("SKIP: NCCL over %d GPUs: this host has %d\n", L,
               fl_dev_count(FL_DEV_CUDA, NULL, 0));
        return 0;
    }
#else
    (void)c;
#endif
    return L;
}

static bool open_bench(bench_t *b, const cfg_t *c, int L, int timeout_ms)
{
    memset(b, 0, sizeof *b);
    if (usable(c, L) == 0)
        return false;
    b->c = *c;
    b->L = L;
    for (int j = 0; j < L; j++) {
        fl_dev_opts_t o;
        fl_dev_opts_init(&o);
        o.kind = c->kind;
        o.id = c->kind == FL_DEV_CPU || c->same_gpu ? 0 : j;
        if (c->kind == FL_DEV_SIM)
            o.sim_jitter_us = c->jitter_us;
        OK(fl_dev_create(&o, &b->d[j]));
        OK(fl_dev_bind(b->d[j]));
        OK(fl_stream_create(b->d[j], &b->st[j]));
        OK(fl_stream_create(b->d[j], &b->cs[j]));
        OK(fl_stream_create(b->d[j], &b->cp[j]));
        OK(fl_event_create(b->d[j], &b->done[j]));
        OK(fl_event_create(b->d[j], &b->ev[j]));
    }
    fl_intra_opts_t io;
    fl_intra_opts_init(&io);
    io.impl = c->impl;
    io.host = "test-host";
    io.timeout_ms = timeout_ms;
    OK(fl_intra_create(b->d, L, &io, &b->x));
    ck_assert_int_eq(fl_intra_impl(b->x), c->impl);
    ck_assert_int_eq(fl_intra_size(b->x), L);
    return true;
}

static void reserve(bench_t *b, size_t n)
{
    if (n <= b->cap && b->cap > 0)
        return;
    for (int j = 0; j < b->L; j++) {
        OK(fl_stream_sync(b->st[j], 10000));
        fl_dev_free(b->d[j], &b->buf[j]);
        OK(fl_dev_alloc(b->d[j], (n ? n : 1) * sizeof(float), &b->buf[j]));
    }
    b->cap = n ? n : 1;
}

static void close_bench(bench_t *b)
{
    if (b->x != NULL)
        OK(fl_intra_wait(b->x, 10000));
    fl_intra_destroy(&b->x);
    for (int j = 0; j < b->L; j++) {
        fl_stream_destroy(&b->st[j]);
        fl_stream_destroy(&b->cs[j]);
        fl_stream_destroy(&b->cp[j]);
        fl_event_destroy(&b->done[j]);
        fl_event_destroy(&b->ev[j]);
        fl_dev_free(b->d[j], &b->buf[j]);
        fl_dev_destroy(&b->d[j]);
    }
}

/* Device j's data: count random floats, then zeros to the padded size. */
static float *data(size_t count, size_t P, int j, uint64_t seed)
{
    float *h = calloc(P ? P : 1, sizeof *h);
    uint64_t s = seed * 131 + (uint64_t)j;
    for (size_t i = 0; i < count; i++)
        h[i] = (float)(fl_test_uniform(&s) * 8.0);
    return h;
}

static void load(bench_t *b, float *const *h, size_t P)
{
    for (int j = 0; j < b->L; j++)
        OK(fl_dev_h2d(b->st[j], b->buf[j], h[j], P * sizeof(float)));
}

static void read_all(bench_t *b, float *const *out, size_t P)
{
    OK(fl_intra_wait(b->x, 20000));
    for (int j = 0; j < b->L; j++) {
        OK(fl_dev_d2h(b->st[j], out[j], b->buf[j], P * sizeof(float)));
        OK(fl_stream_sync(b->st[j], 20000));
    }
}

/* NCCL over several GPUs adds in its own order. */
static bool exact(const bench_t *b)
{
    return !(b->c.impl == FL_INTRA_NCCL && b->L > 1);
}

static void expect(const bench_t *b, const char *what, int j, size_t i, float got, float want)
{
    bool same = memcmp(&got, &want, sizeof got) == 0;
    if (!same && !exact(b))
        same = fabsf(got - want) <= 1e-5f * (fabsf(want) + 1.0f);
    if (!same)
        ck_abort_msg("%s %s L=%d: device %d element %zu = %a, the reference %a",
                     fl_intra_impl_name(b->c.impl), what, b->L, j, i, (double)got, (double)want);
}

/* The reference reduce-scatter of element i: device order, then times 1/L for avg. */
static float ref_sum(float *const *h, int L, size_t i, fl_op_t op)
{
    float s = h[0][i];
    for (int k = 1; k < L; k++)
        s += h[k][i];
    float alpha = op == FL_AVG ? 1.0f / (float)L : 1.0f;
    return alpha != 1.0f ? s * alpha : s;
}

static const size_t counts[] = {0, 1, 2, 3, 5, 7, 64, 1001, 4099};

START_TEST(test_ops_match_reference)
{
    const cfg_t *c = &cfgs[_i];
    for (int L = 1; L <= MAXL; L++) {
        bench_t b;
        if (!open_bench(&b, c, L, 60000))
            continue;
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            size_t count = counts[ci];
            size_t P = fl_intra_padded(count, L);
            size_t S = fl_intra_shard_len(count, L);
            ck_assert_uint_eq(P % (size_t)L, 0);
            ck_assert(P >= count && P < count + (size_t)L);
            reserve(&b, P);
            float *h[MAXL];
            float *got[MAXL];
            for (int j = 0; j < L; j++) {
                h[j] = data(count, P, j, count);
                got[j] = calloc(P ? P : 1, sizeof(float));
            }
            for (int pass = 0; pass < 2; pass++) {
                fl_op_t op = pass == 0 ? FL_SUM : FL_AVG;
                load(&b, h, P);
                OK(fl_intra_reduce_scatter(b.x, b.buf, count, op, b.st, NULL));
                read_all(&b, got, P);
                for (int j = 0; j < L; j++) {
                    for (size_t i = 0; i < P; i++) {
                        bool mine = i / S == (size_t)j;
                        if (i >= count)
                            expect(&b, "padding", j, i, got[j][i], 0.0f);
                        else if (mine)
                            expect(&b, op == FL_SUM ? "reduce-scatter sum" : "reduce-scatter avg",
                                   j, i, got[j][i], ref_sum(h, L, i, op));
                        else if (b.c.impl != FL_INTRA_NCCL) /* NCCL may use them as scratch */
                            expect(&b, "a shard of another device", j, i, got[j][i], h[j][i]);
                    }
                }
            }
            /* All-gather after the average: every device holds the whole reduced vector. */
            OK(fl_intra_allgather(b.x, b.buf, count, b.st, NULL));
            read_all(&b, got, P);
            for (int j = 0; j < L; j++)
                for (size_t i = 0; i < P; i++)
                    expect(&b, i < count ? "all-gather" : "padding after all-gather", j, i,
                           got[j][i], i < count ? ref_sum(h, L, i, FL_AVG) : 0.0f);
            /* Broadcast from the last device of its own data: count elements, no padding. */
            int root = L - 1;
            load(&b, h, P);
            OK(fl_intra_broadcast(b.x, b.buf, count, root, b.st, NULL));
            read_all(&b, got, P);
            for (int j = 0; j < L; j++)
                for (size_t i = 0; i < P; i++)
                    expect(&b, "broadcast", j, i, got[j][i], h[root][i]);
            for (int j = 0; j < L; j++) {
                free(h[j]);
                free(got[j]);
            }
        }
        close_bench(&b);
    }
}
END_TEST

/* Producers on the compute streams, the collectives behind their events, consumers behind
 * done; and a buffer rewritten as soon as its own stream passed the call must not reach the
 * others' results (they have read it by then). No host wait in between: with sim's jitter a
 * missing event is a wrong number. */
START_TEST(test_events_chain)
{
    const cfg_t *c = &cfgs[_i];
    int L = c->kind == FL_DEV_CUDA && !c->same_gpu ? fl_dev_count(FL_DEV_CUDA, NULL, 0) : 3;
    L = L > MAXL ? MAXL : L;
    bench_t b;
    if (L < 1 || !open_bench(&b, c, L, 60000))
        return;
    size_t count = 3001;
    size_t P = fl_intra_padded(count, L);
    size_t S = fl_intra_shard_len(count, L);
    reserve(&b, P);
    float *h[MAXL];
    float *got[MAXL];
    float *ones = malloc(P * sizeof *ones);
    float *junk = malloc(P * sizeof *junk);
    for (size_t i = 0; i < P; i++) {
        ones[i] = i < count ? 1.0f : 0.0f;
        junk[i] = 1e30f;
    }
    fl_dptr_t one[MAXL];
    for (int j = 0; j < L; j++) {
        h[j] = data(count, P, j, 77);
        got[j] = calloc(P, sizeof(float));
        OK(fl_dev_alloc(b.d[j], P * sizeof(float), &one[j]));
        OK(fl_dev_h2d(b.cs[j], one[j], ones, P * sizeof(float)));
    }
    for (int round = 0; round < 16; round++) {
        /* Produce: the data plus 5 (five slow updates), on the compute streams. */
        for (int j = 0; j < L; j++) {
            OK(fl_dev_h2d(b.cs[j], b.buf[j], h[j], P * sizeof(float)));
            for (int r = 0; r < 5; r++)
                OK(fl_dev_axpy(b.cs[j], b.buf[j], one[j], P, 1.0f));
            OK(fl_event_record(b.ev[j], b.cs[j]));
            OK(fl_stream_wait(b.st[j], b.ev[j]));
        }
        OK(fl_intra_reduce_scatter(b.x, b.buf, count, FL_AVG, b.st, b.done));
        /* Consume shard j behind done; the compute stream then rewrites the other shards. */
        for (int j = 0; j < L; j++) {
            OK(fl_stream_wait(b.cp[j], b.done[j]));
            OK(fl_dev_d2h(b.cp[j], got[j] + (size_t)j * S, fl_dptr_f32(b.buf[j], (size_t)j * S),
                          S * sizeof(float)));
            OK(fl_event_record(b.ev[j], b.cp[j]));
            OK(fl_stream_wait(b.cs[j], b.ev[j]));
            for (int k = 0; k < L; k++)
                if (k != j)
                    OK(fl_dev_h2d(b.cs[j], fl_dptr_f32(b.buf[j], (size_t)k * S),
                                  junk + (size_t)k * S, S * sizeof(float)));
            OK(fl_event_record(b.ev[j], b.cs[j]));
            OK(fl_stream_wait(b.st[j], b.ev[j]));
        }
        /* All-gather chained the same way (the junk is overwritten by it). */
        OK(fl_intra_allgather(b.x, b.buf, count, b.st, b.done));
        for (int j = 0; j < L; j++) {
            OK(fl_stream_wait(b.cp[j], b.done[j]));
            OK(fl_dev_d2h(b.cp[j], got[j], b.buf[j], P * sizeof(float)));
        }
        for (int j = 0; j < L; j++)
            OK(fl_stream_sync(b.cp[j], 20000));
        float *h5[MAXL];
        for (int j = 0; j < L; j++) {
            h5[j] = malloc(P * sizeof(float));
            for (size_t i = 0; i < P; i++) {
                float v = h[j][i];
                for (int r = 0; r < 5; r++)
                    v += ones[i];
                h5[j][i] = v;
            }
        }
        for (int j = 0; j < L; j++)
            for (size_t i = 0; i < P; i++)
                expect(&b, "chained reduce-scatter and all-gather", j, i, got[j][i],
                       i < count ? ref_sum(h5, L, i, FL_AVG) : 0.0f);
        for (int j = 0; j < L; j++)
            free(h5[j]);
    }
    OK(fl_intra_wait(b.x, 20000));
    for (int j = 0; j < L; j++) {
        OK(fl_stream_sync(b.cs[j], 20000));
        fl_dev_free(b.d[j], &one[j]);
        free(h[j]);
        free(got[j]);
    }
    free(ones);
    free(junk);
    close_bench(&b);
}
END_TEST

#ifndef INTRA_TEST_CUDA
/* Refusals before anything is queued, each naming what is wrong. */
START_TEST(test_refusals)
{
    bench_t b;
    cfg_t c = {FL_DEV_SIM, FL_INTRA_COPY, 0, false};
    ck_assert(open_bench(&b, &c, 2, 60000));
    reserve(&b, 8);
    fl_stream_t *swapped[2] = {b.st[1], b.st[0]};
    ck_assert_int_eq(fl_intra_reduce_scatter(b.x, b.buf, 8, FL_SUM, swapped, NULL), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "host test-host") &&
                      strstr(fl_last_error(), "reduce-scatter") &&
                      strstr(fl_last_error(), "device sim:0"),
                  "%s", fl_last_error());
    ck_assert_int_eq(fl_intra_reduce_scatter(b.x, b.buf, 8, FL_MAX, b.st, NULL), FL_EINVAL);
    ck_assert_int_eq(fl_intra_broadcast(b.x, b.buf, 8, 2, b.st, NULL), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "root 2") != NULL, "%s", fl_last_error());
    fl_dptr_t nulls[2] = {b.buf[0], fl_dptr_null()};
    ck_assert_int_eq(fl_intra_allgather(b.x, nulls, 8, b.st, NULL), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "sim:1") != NULL, "%s", fl_last_error());

    fl_intra_opts_t io;
    fl_intra_opts_init(&io);
    io.host = "test-host";
    fl_intra_t *x = NULL;
    io.impl = FL_INTRA_HOST;
    ck_assert_int_eq(fl_intra_create(b.d, 2, &io, &x), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "cpu devices") != NULL, "%s", fl_last_error());
    io.impl = FL_INTRA_NCCL;
    ck_assert_int_eq(fl_intra_create(b.d, 2, &io, &x), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), fl_intra_nccl_built() ? "NCCL serves cuda devices"
                                                                : "NCCL not built in") != NULL,
                  "%s", fl_last_error());
    io.impl = FL_INTRA_AUTO;
    OK(fl_intra_create(b.d, 1, &io, &x));
    ck_assert_int_eq(fl_intra_impl(x), FL_INTRA_COPY);
    fl_intra_destroy(&x);
    ck_assert_int_eq(fl_intra_create(b.d, 0, &io, &x), FL_EINVAL);
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    fl_dev_t *cpu = NULL;
    OK(fl_dev_create(&o, &cpu));
    fl_dev_t *mixed[2] = {b.d[0], cpu};
    ck_assert_int_eq(fl_intra_create(mixed, 2, &io, &x), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "different kinds") != NULL, "%s", fl_last_error());
    OK(fl_intra_create(&cpu, 1, &io, &x));
    ck_assert_int_eq(fl_intra_impl(x), FL_INTRA_HOST);
    fl_intra_destroy(&x);
    fl_dev_destroy(&cpu);
    close_bench(&b);
}
END_TEST

/* A device whose buffer is too small (a fault on its memory): the queued work fails, and the
 * wait reports it naming the host, the device and the operation. */
START_TEST(test_device_error_reported)
{
    bench_t b;
    cfg_t c = {FL_DEV_SIM, FL_INTRA_COPY, 50, false};
    ck_assert(open_bench(&b, &c, 3, 60000));
    size_t count = 999;
    reserve(&b, fl_intra_padded(count, 3));
    fl_dev_free(b.d[1], &b.buf[1]);
    OK(fl_dev_alloc(b.d[1], 100 * sizeof(float), &b.buf[1]));
    OK(fl_intra_reduce_scatter(b.x, b.buf, count, FL_SUM, b.st, NULL));
    ck_assert_int_eq(fl_intra_wait(b.x, 20000), FL_EINVAL);
    const char *e = fl_last_error();
    ck_assert_msg(strstr(e, "host test-host") && strstr(e, "reduce-scatter") &&
                      strstr(e, "sim:1") && strstr(e, "outside device memory"),
                  "%s", e);
    /* The streams are failed for good (sticky): new ones for the end. */
    for (int j = 0; j < 3; j++) {
        fl_stream_destroy(&b.st[j]);
        OK(fl_stream_create(b.d[j], &b.st[j]));
    }
    fl_intra_destroy(&b.x);
    close_bench(&b);
}
END_TEST

/* A wait past its deadline says which devices are not done (the copy implementation has
 * nothing to abort: the handle is still good after). */
START_TEST(test_wait_deadline)
{
    bench_t b;
    cfg_t c = {FL_DEV_SIM, FL_INTRA_COPY, 0, false};
    ck_assert(open_bench(&b, &c, 2, 60000));
    size_t count = 1 << 10;
    reserve(&b, count);
    /* Device 1's stream is held by a wait on an event recorded behind a slow chain. */
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = FL_DEV_SIM;
    o.id = 9;
    o.sim_jitter_us = 100000;
    fl_dev_t *slow = NULL;
    fl_stream_t *ss = NULL;
    fl_event_t *se = NULL;
    OK(fl_dev_create(&o, &slow));
    OK(fl_stream_create(slow, &ss));
    OK(fl_event_create(slow, &se));
    fl_dptr_t p;
    OK(fl_dev_alloc(slow, 64, &p));
    for (int r = 0; r < 10; r++)
        OK(fl_dev_memset(ss, p, 0, 64));
    OK(fl_event_record(se, ss));
    OK(fl_stream_wait(b.st[1], se));
    OK(fl_intra_allgather(b.x, b.buf, count, b.st, NULL));
    ck_assert_int_eq(fl_intra_wait(b.x, 30), FL_ETIMEDOUT);
    ck_assert_msg(strstr(fl_last_error(), "host test-host") &&
                      strstr(fl_last_error(), "all-gather") && strstr(fl_last_error(), "sim:1"),
                  "%s", fl_last_error());
    OK(fl_intra_wait(b.x, 20000));
    fl_dev_free(slow, &p);
    fl_event_destroy(&se);
    fl_stream_destroy(&ss);
    fl_dev_destroy(&slow);
    close_bench(&b);
}
END_TEST
#endif

Suite *intra_suite(void);
Suite *intra_suite(void)
{
    Suite *s = suite_create("intra");
    TCase *t = tcase_create("intra");
    tcase_set_timeout(t, 240);
    tcase_add_loop_test(t, test_ops_match_reference, 0, NCFGS);
    tcase_add_loop_test(t, test_events_chain, 0, NCFGS);
#ifndef INTRA_TEST_CUDA
    tcase_add_test(t, test_refusals);
    tcase_add_test(t, test_device_error_reported);
    tcase_add_test(t, test_wait_deadline);
#endif
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
#ifdef INTRA_TEST_CUDA
    int probe = fl_test_gpu_probe("intra-host collectives (cuda, NCCL)");
    if (probe != 0)
        return probe;
#endif
    return fl_test_run(intra_suite());
}
