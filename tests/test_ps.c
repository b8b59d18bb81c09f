/* The parameter server end to end in one process: a coordinator, a server with its shards and
 * W ranks as threads with real clients over TCP on 127.0.0.1. Sync training gives bit for bit
 * the parameters of a local computation (SGD with momentum and Adam, dense and sparse pushes,
 * float16 values, lz4); async applies every push; SSP holds a fast rank at exactly s steps
 * and names the slow one; checkpoints are written, kept, and resumed after a restart of the
 * whole parameter server, the ranks rejoining with FL_ERESYNC and ending with the parameters
 * of an uninterrupted run. */
#include <math.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fl_ps.h"
#include "ps_int.h"
#include "testutil.h"

#define N 5000 /* parameters: two shards of 2500, each crossing the apply pass's blocks */
#define MAXW 4

#define ASSERT_HAS(text, needle)                                                                   \
    ck_assert_msg(strstr((text), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (text),      \
                  (needle))

typedef struct job {
    fl_coord_t *coord;
    fl_ps_server_t *srv;
    char endpoint[FL_ENDPOINT_MAX];
} job_t;

typedef struct job_spec {
    int world;
    int shards;
    fl_ps_consistency_t consistency;
    uint32_t staleness;
    fl_opt_kind_t opt;
    double lr;
    double momentum;      /* SGD: with Nesterov when > 0 */
    const char *bind;     /* NULL: tcp://127.0.0.1:0 */
    const char *ckpt_dir; /* NULL: none */
    uint64_t ckpt_steps;
    bool resume;
    int hb_timeout_ms;
} job_spec_t;

static job_spec_t spec(int world, int shards, fl_ps_consistency_t c)
{
    job_spec_t s = {world, shards, c, 0, FL_OPT_SGD, 0.1, 0.9, NULL, NULL, 0, false, 2000};
    return s;
}

static void server_opts(const job_spec_t *s, const char *coordinator, fl_ps_server_opts_t *o)
{
    fl_ps_server_opts_init(o);
    o->coordinator = coordinator;
    o->host = "127.0.0.1";
    o->num_shards = s->shards;
    o->shard_first = 0;
    o->shard_count = s->shards;
    o->consistency = s->consistency;
    o->staleness = s->staleness;
    o->opt.kind = s->opt;
    if (s->opt == FL_OPT_SGD && s->momentum > 0) {
        o->opt.momentum = s->momentum;
        o->opt.nesterov = true;
    }
    fl_lr_sched_init(&o->lr, s->lr);
    o->checkpoint_dir = s->ckpt_dir;
    o->ckpt_every_steps = s->ckpt_steps;
    o->keep = 2;
    o->resume = s->resume;
    o->rendezvous_timeout_ms = 20000;
    o->log_level = FL_LOG_OFF;
}

static void job_start(job_t *j, const job_spec_t *s)
{
    memset(j, 0, sizeof *j);
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = s->bind ? s->bind : "tcp://127.0.0.1:0";
    co.world_size = s->world;
    co.num_shards = s->shards;
    co.heartbeat_timeout_ms = s->hb_timeout_ms;
    co.rendezvous_timeout_ms = 20000;
    co.log_level = FL_LOG_OFF;
    ck_assert_msg(fl_coord_create(&co, &j->coord) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_coord_start(j->coord) == FL_OK);
    snprintf(j->endpoint, sizeof j->endpoint, "%s", fl_coord_endpoint(j->coord));
    fl_ps_server_opts_t so;
    server_opts(s, j->endpoint, &so);
    ck_assert_msg(fl_ps_server_create(&so, &j->srv) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_ps_server_start(j->srv) == FL_OK);
}

static void job_end(job_t *j)
{
    fl_ps_server_stop(j->srv);
    fl_ps_server_destroy(&j->srv);
    fl_coord_stop(j->coord);
    fl_coord_destroy(&j->coord);
}

static void client_opts(fl_ps_client_opts_t *o, const char *coordinator, int rank, int world)
{
    fl_ps_client_opts_init(o);
    o->rank = rank;
    o->world_size = world;
    o->coordinator = coordinator;
    o->host = "127.0.0.1";
    o->param_count = N;
    o->timeout_ms = 10000;
    o->rendezvous_timeout_ms = 20000;
    o->reconnect_timeout_ms = 20000;
    o->log_level = FL_LOG_OFF;
}

/* The gradient rank r pushes at step t: a function of (r, t) only, so a step redone after a
 * restart pushes the same numbers. Values are multiples of 1/256 in (-4, 4): float16 holds
 * them exactly. */
static void grad_of(int r, uint64_t t, float *g)
{
    uint64_t seed = 1000003ULL * (uint64_t)(r + 1) + 7919ULL * t;
    for (int i = 0; i < N; i++)
        g[i] = (float)(int)(fl_test_uniform(&seed) * 1024.0) / 256.0f;
}

/* Multiples of 1/1024 in [-1, 1): with dyadic gradients and learning rates, plain SGD sums
 * exactly, whatever the order of the updates. */
static void init_params(float *p)
{
    uint64_t seed = 42;
    for (int i = 0; i < N; i++)
        p[i] = (float)(int)(fl_test_uniform(&seed) * 1024.0) / 1024.0f;
}

/* The local computation sync training must match: mean of the W gradients in rank order,
 * then the optimizer, `steps` times. */
static void reference(int world, int steps, fl_opt_kind_t kind, float *p)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.kind = kind;
    if (kind == FL_OPT_SGD) {
        o.momentum = 0.9;
        o.nesterov = true;
    }
    fl_opt_t *opt = NULL;
    ck_assert(fl_opt_create(&o, N, &opt) == FL_OK);
    init_params(p);
    static float g[MAXW][N], avg[N];
    for (int t = 0; t < steps; t++) {
        for (int r = 0; r < world; r++)
            grad_of(r, (uint64_t)t, g[r]);
        for (int i = 0; i < N; i++) {
            float acc = g[0][i];
            for (int r = 1; r < world; r++)
                acc = acc + g[r][i];
            avg[i] = acc / (float)world;
        }
        ck_assert(fl_opt_step(opt, p, avg, 0.1) == FL_OK);
    }
    fl_opt_destroy(&opt);
}

/* ---- ranks as threads ---- */

typedef struct rank_ctx {
    const char *coordinator;
    int rank;
    int world;
    int steps;
    int (*body)(struct rank_ctx *rc, fl_ps_client_t *cl);
    fl_ps_client_opts_t opts;
    float params[N];
    int rc;
    char err[1024];
    void *user;
    fl_ps_client_stats_t stats;
} rank_ctx_t;

static void *rank_main(void *arg)
{
    rank_ctx_t *r = arg;
    fl_ps_client_t *cl = NULL;
    r->rc = fl_ps_client_create(&r->opts, &cl);
    if (r->rc == FL_OK) {
        r->rc = r->body(r, cl);
        if (r->rc != FL_OK)
            snprintf(r->err, sizeof r->err, "%s", fl_last_error());
        fl_ps_client_get_stats(cl, &r->stats);
        fl_ps_client_destroy(&cl);
    } else {
        snprintf(r->err, sizeof r->err, "create: %s", fl_last_error());
    }
    return NULL;
}

static void run_ranks(rank_ctx_t *ctx, int world)
{
    pthread_t th[MAXW];
    for (int r = 0; r < world; r++)
        ck_assert(pthread_create(&th[r], NULL, rank_main, &ctx[r]) == 0);
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
}

static void setup_ranks(rank_ctx_t *ctx, const job_t *j, int world, int steps,
                        int (*body)(rank_ctx_t *, fl_ps_client_t *))
{
    for (int r = 0; r < world; r++) {
        memset(&ctx[r], 0, sizeof ctx[r]);
        ctx[r].coordinator = j->endpoint;
        ctx[r].rank = r;
        ctx[r].world = world;
        ctx[r].steps = steps;
        ctx[r].body = body;
        client_opts(&ctx[r].opts, j->endpoint, r, world);
    }
}

/* A training loop: join, then push the step's gradient and pull the next parameters. */
static int train_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    init_params(r->params);
    if (r->rank != 0)
        memset(r->params, 0, sizeof r->params); /* rank 0's are taken */
    int rc = fl_ps_client_init(cl, r->params);
    if (rc != FL_OK)
        return rc;
    static _Thread_local float g[N];
    while ((int)fl_ps_client_step(cl) < r->steps) {
        grad_of(r->rank, fl_ps_client_step(cl), g);
        fl_ps_grad_t grad = {.dense = g, .batch = 16};
        rc = fl_ps_client_push_pull(cl, &grad, r->params);
        if (rc != FL_OK && rc != FL_ERESYNC)
            return rc;
    }
    return FL_OK;
}

static void expect_all_ok(rank_ctx_t *ctx, int world)
{
    for (int r = 0; r < world; r++)
        ck_assert_msg(ctx[r].rc == FL_OK, "rank %d: %s: %s", r, fl_strerror(ctx[r].rc), ctx[r].err);
}

static void sync_exact(fl_opt_kind_t kind, int shards, fl_dtype_t values, int lz4)
{
    enum { W = 3, STEPS = 4 };
    job_t j;
    job_spec_t s = spec(W, shards, FL_PS_SYNC);
    s.opt = kind;
    job_start(&j, &s);
    static rank_ctx_t ctx[W];
    setup_ranks(ctx, &j, W, STEPS, train_body);
    for (int r = 0; r < W; r++) {
        ctx[r].opts.values = values;
        ctx[r].opts.lz4 = lz4;
    }
    run_ranks(ctx, W);
    expect_all_ok(ctx, W);
    static float ref[N];
    reference(W, STEPS, kind, ref);
    for (int r = 0; r < W; r++)
        ck_assert_msg(memcmp(ctx[r].params, ref, sizeof ref) == 0,
                      "rank %d's parameters differ from the local computation", r);
    ck_assert_uint_eq(ctx[0].stats.pushes, STEPS);
    ck_assert_uint_eq(ctx[0].stats.pulls, STEPS + 1);
    if (values == FL_FLOAT16)
        ck_assert_uint_eq(ctx[1].stats.bytes_sent, STEPS * N * 2); /* half the raw bytes */
    job_end(&j);
}

START_TEST(test_sync_sgd_exact)
{
    sync_exact(FL_OPT_SGD, 2, FL_FLOAT32, 0);
}
END_TEST

START_TEST(test_sync_adam_exact_one_shard)
{
    sync_exact(FL_OPT_ADAM, 1, FL_FLOAT32, 0);
}
END_TEST

/* The gradients are multiples of 1/1024 within float16's range: float16 carries them exactly,
 * and lz4 changes nothing. */
START_TEST(test_sync_half_and_lz4_exact)
{
    sync_exact(FL_OPT_SGD, 3, FL_FLOAT16, 1);
}
END_TEST

/* ---- a rank split into clients per device (fl_ps_client_split) ---- */

typedef struct part_arg {
    rank_ctx_t *r;
    fl_ps_client_t *part;
    int rc;
    char err[1024];
} part_arg_t;

static void *part_main(void *arg)
{
    part_arg_t *a = arg;
    static _Thread_local float g[N];
    a->rc = FL_OK;
    while (a->rc == FL_OK && (int)fl_ps_client_step(a->part) < a->r->steps) {
        grad_of(a->r->rank, fl_ps_client_step(a->part), g);
        fl_ps_grad_t grad = {.dense = g, .batch = 16};
        a->rc = fl_ps_client_push_pull(a->part, &grad, a->r->params);
    }
    if (a->rc != FL_OK)
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
    return NULL;
}

/* Rank 0 as two parts, each on its own thread over its own shards; the other ranks whole. */
static int split_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    if (r->rank != 0)
        return train_body(r, cl);
    init_params(r->params);
    int rc = fl_ps_client_init(cl, r->params);
    if (rc != FL_OK)
        return rc;
    fl_ps_client_t *bad = NULL;
    int shards = fl_ps_client_num_shards(cl);
    if (fl_ps_client_split(cl, 0, shards + 1, &bad) != FL_EINVAL)
        return fl_fail(FL_EPROTO, "more parts than shards accepted");
    part_arg_t a[2];
    memset(a, 0, sizeof a);
    for (int j = 0; j < 2; j++) {
        a[j].r = r;
        if ((rc = fl_ps_client_split(cl, j, 2, &a[j].part)) != FL_OK)
            return rc;
    }
    if (fl_ps_client_split(a[1].part, 0, 1, &bad) != FL_EINVAL)
        return fl_fail(FL_EPROTO, "a part split again");
    size_t off[2], n[2];
    for (int j = 0; j < 2; j++)
        fl_ps_client_part_range(a[j].part, &off[j], &n[j]);
    if (off[0] != 0 || off[0] + n[0] != off[1] || off[1] + n[1] != N || n[0] == 0)
        rc = fl_fail(FL_EPROTO, "parts cover %zu+%zu and %zu+%zu of %d", off[0], n[0], off[1], n[1],
                     N);
    pthread_t th;
    if (rc == FL_OK && pthread_create(&th, NULL, part_main, &a[1]) == 0) {
        part_main(&a[0]); /* part 0 on the thread that owns the client */
        pthread_join(th, NULL);
        for (int j = 0; j < 2 && rc == FL_OK; j++)
            if (a[j].rc != FL_OK)
                rc = fl_fail(a[j].rc, "part %d: %s", j, a[j].err);
    }
    for (int j = 0; j < 2; j++)
        fl_ps_client_destroy(&a[j].part);
    return rc;
}

/* 3 shards (part 0: shard 0; part 1: shards 1 and 2): the server's result is the local
 * computation's, bit for bit, with one rank split and the others whole clients. */
START_TEST(test_sync_split_rank_exact)
{
    enum { W = 3, STEPS = 4 };
    job_t j;
    job_spec_t s = spec(W, 3, FL_PS_SYNC);
    job_start(&j, &s);
    static rank_ctx_t ctx[W];
    setup_ranks(ctx, &j, W, STEPS, split_body);
    run_ranks(ctx, W);
    expect_all_ok(ctx, W);
    static float ref[N];
    reference(W, STEPS, FL_OPT_SGD, ref);
    for (int r = 0; r < W; r++)
        ck_assert_msg(memcmp(ctx[r].params, ref, sizeof ref) == 0,
                      "rank %d's parameters differ from the local computation", r);
    job_end(&j);
}
END_TEST

/* Sparse pushes: rank r sends every 10th entry starting at r; the server's result equals the
 * same computation on the dense equivalents. */
static int sparse_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    init_params(r->params);
    int rc = fl_ps_client_init(cl, r->params);
    if (rc != FL_OK)
        return rc;
    static _Thread_local float g[N], val[N];
    static _Thread_local uint32_t idx[N];
    while ((int)fl_ps_client_step(cl) < r->steps) {
        grad_of(r->rank, fl_ps_client_step(cl), g);
        size_t k = 0;
        for (int i = r->rank; i < N; i += 10) {
            idx[k] = (uint32_t)i;
            val[k++] = g[i];
        }
        fl_ps_grad_t grad = {.idx = idx, .val = val, .k = k, .batch = 8};
        rc = fl_ps_client_push_pull(cl, &grad, r->params);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

START_TEST(test_sync_sparse_exact)
{
    enum { W = 2, STEPS = 3 };
    job_t j;
    job_spec_t s = spec(W, 2, FL_PS_SYNC);
    job_start(&j, &s);
    static rank_ctx_t ctx[W];
    setup_ranks(ctx, &j, W, STEPS, sparse_body);
    run_ranks(ctx, W);
    expect_all_ok(ctx, W);
    /* Reference with the dense equivalents. */
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.momentum = 0.9;
    o.nesterov = true;
    fl_opt_t *opt = NULL;
    ck_assert(fl_opt_create(&o, N, &opt) == FL_OK);
    static float p[N], g[W][N], avg[N];
    init_params(p);
    for (int t = 0; t < STEPS; t++) {
        for (int r = 0; r < W; r++) {
            float full[N];
            grad_of(r, (uint64_t)t, full);
            for (int i = 0; i < N; i++)
                g[r][i] = i % 10 == r ? full[i] : 0.0f;
        }
        for (int i = 0; i < N; i++)
            avg[i] = (g[0][i] + g[1][i]) / 2.0f;
        ck_assert(fl_opt_step(opt, p, avg, 0.1) == FL_OK);
    }
    fl_opt_destroy(&opt);
    ck_assert_int_eq(memcmp(ctx[0].params, p, sizeof p), 0);
    ck_assert_int_eq(memcmp(ctx[1].params, p, sizeof p), 0);
    /* 10% of the entries, each an index and a value: far less than the dense pushes (rank 1:
     * rank 0 also sent the initial parameters). */
    ck_assert_msg(ctx[1].stats.bytes_sent * 4 < ctx[1].stats.raw_bytes, "%llu of %llu bytes",
                  (unsigned long long)ctx[1].stats.bytes_sent,
                  (unsigned long long)ctx[1].stats.raw_bytes);
    job_end(&j);
}
END_TEST

/* Async: rank 1 starts only once rank 0 has finished all its steps, so rank 0 never waited
 * for it (were it held, it would time out). Every push is applied once, scaled by 1/W: with
 * plain SGD and dyadic numbers the sums are exact, and rank 1's last pull, after every push,
 * equals the sum of all updates. */
static _Atomic int async_done;

static int async_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    init_params(r->params);
    int rc = fl_ps_client_init(cl, r->params);
    if (rc != FL_OK)
        return rc;
    if (r->rank == 1) {
        int64_t until = fl_now_ms() + 15000;
        while (!atomic_load(&async_done) && fl_now_ms() < until)
            usleep(10000);
        if (!atomic_load(&async_done))
            return fl_fail(FL_ETIMEDOUT, "rank 0 never finished without rank 1");
    }
    static _Thread_local float g[N];
    while ((int)fl_ps_client_step(cl) < r->steps) {
        grad_of(r->rank, fl_ps_client_step(cl), g);
        fl_ps_grad_t grad = {.dense = g, .batch = 1};
        rc = fl_ps_client_push_pull(cl, &grad, r->params);
        if (rc != FL_OK)
            return rc;
    }
    if (r->rank == 0)
        atomic_store(&async_done, 1);
    return FL_OK;
}

START_TEST(test_async_applies_every_push)
{
    enum { W = 2, STEPS = 5 };
    atomic_store(&async_done, 0);
    job_t j;
    job_spec_t s = spec(W, 2, FL_PS_ASYNC);
    s.momentum = 0;
    s.lr = 0.125;
    job_start(&j, &s);
    static rank_ctx_t ctx[W];
    setup_ranks(ctx, &j, W, STEPS, async_body);
    ctx[0].opts.timeout_ms = 3000;
    run_ranks(ctx, W);
    expect_all_ok(ctx, W);
    static float p[N], g[N];
    init_params(p);
    for (int r = 0; r < W; r++)
        for (int t = 0; t < STEPS; t++) {
            grad_of(r, (uint64_t)t, g);
            for (int i = 0; i < N; i++)
                p[i] = p[i] - 0.125f * (g[i] * 0.5f);
        }
    ck_assert_int_eq(memcmp(ctx[1].params, p, sizeof p), 0);
    job_end(&j);
}
END_TEST

/* SSP with s = 1 and W = 2: rank 1 pushes nothing for a while. Rank 0 completes step 0
 * (parameters for step 1 need rank 1 at >= 0 completed steps: fine), then its pull for step 2
 * needs rank 1 at >= 1 completed step: held, and after its deadline the error names rank 1. */
static int ssp_fast_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    int rc = fl_ps_client_init(cl, r->params);
    if (rc != FL_OK)
        return rc;
    static _Thread_local float g[N];
    grad_of(0, 0, g);
    fl_ps_grad_t grad = {.dense = g, .batch = 1};
    if ((rc = fl_ps_client_push_pull(cl, &grad, r->params)) != FL_OK)
        return rc;
    int64_t t0 = fl_now_ms();
    rc = fl_ps_client_push_pull(cl, &grad, r->params); /* step 1, then params for step 2 */
    int64_t waited = fl_now_ms() - t0;
    if (rc != FL_ETIMEDOUT)
        return fl_fail(FL_EINVAL, "expected the bound to hold rank 0, got %d (%s)", rc,
                       fl_last_error());
    snprintf(r->err, sizeof r->err, "%s", fl_last_error());
    if (waited < 700)
        return fl_fail(FL_EINVAL, "held only %lld ms", (long long)waited);
    /* Rank 1 is about to complete its step 0: then step 2's parameters are given. */
    char seen[1024];
    snprintf(seen, sizeof seen, "%s", r->err);
    int64_t until = fl_now_ms() + 5000;
    while (fl_now_ms() < until) {
        rc = fl_ps_client_pull(cl, r->params);
        if (rc == FL_OK)
            break;
        if (rc != FL_ETIMEDOUT)
            return rc;
    }
    snprintf(r->err, sizeof r->err, "%s", seen);
    return rc == FL_OK && fl_ps_client_step(cl) == 2 ? FL_OK : FL_EINVAL;
}

static int ssp_slow_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    int rc = fl_ps_client_init(cl, r->params);
    if (rc != FL_OK)
        return rc;
    usleep(1500 * 1000);
    static _Thread_local float g[N];
    grad_of(1, 0, g);
    fl_ps_grad_t grad = {.dense = g, .batch = 1};
    return fl_ps_client_push(cl, &grad);
}

static int ssp_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    return r->rank == 0 ? ssp_fast_body(r, cl) : ssp_slow_body(r, cl);
}

START_TEST(test_ssp_holds_the_fast_rank)
{
    enum { W = 2 };
    job_t j;
    job_spec_t s = spec(W, 2, FL_PS_SSP);
    s.staleness = 1;
    job_start(&j, &s);
    static rank_ctx_t ctx[W];
    setup_ranks(ctx, &j, W, 0, ssp_body);
    ctx[0].opts.timeout_ms = 800;
    run_ranks(ctx, W);
    ck_assert_msg(ctx[0].rc == FL_OK, "rank 0: %s", ctx[0].err);
    ck_assert_msg(ctx[1].rc == FL_OK, "rank 1: %s", ctx[1].err);
    ASSERT_HAS(ctx[0].err, "waiting for rank 1 (127.0.0.1)");
    ASSERT_HAS(ctx[0].err, "completed 0 steps");
    ASSERT_HAS(ctx[0].err, "step 2");
    job_end(&j);
}
END_TEST

/* A NaN in the part of the gradient one shard holds: refused before anything is pushed (no
 * shard half-takes the step), and the step goes on with a finite gradient. */
static int nan_body(rank_ctx_t *r, fl_ps_client_t *cl)
{
    init_params(r->params);
    int rc = fl_ps_client_init(cl, r->params);
    if (rc != FL_OK)
        return rc;
    static _Thread_local float g[N];
    grad_of(0, 0, g);
    g[N - 3] = 0.0f / 0.0f; /* in the last shard's range */
    fl_ps_grad_t grad = {.dense = g, .batch = 1};
    rc = fl_ps_client_push_pull(cl, &grad, r->params);
    if (rc != FL_ENONFINITE || strstr(fl_last_error(), "nothing pushed") == NULL)
        return fl_fail_ctx(FL_EINVAL, "expected FL_ENONFINITE, got %d", rc);
    snprintf(r->err, sizeof r->err, "%s", fl_last_error());
    if (fl_ps_client_step(cl) != 0)
        return fl_fail(FL_EINVAL, "the step moved to %llu",
                       (unsigned long long)fl_ps_client_step(cl));
    grad_of(0, 0, g);
    if ((rc = fl_ps_client_push_pull(cl, &grad, r->params)) != FL_OK)
        return rc;
    return fl_ps_client_step(cl) == 1 ? FL_OK : FL_EINVAL;
}

START_TEST(test_nan_gradient_pushes_nothing)
{
    job_t j;
    job_spec_t s = spec(1, 2, FL_PS_SYNC);
    job_start(&j, &s);
    static rank_ctx_t ctx[1];
    setup_ranks(ctx, &j, 1, 1, nan_body);
    run_ranks(ctx, 1);
    ck_assert_msg(ctx[0].rc == FL_OK, "%s", ctx[0].err);
    ASSERT_HAS(ctx[0].err, "NaN at index 4997");
    static float ref[N];
    reference(1, 1, FL_OPT_SGD, ref);
    ck_assert_int_eq(memcmp(ctx[0].params, ref, sizeof ref), 0);
    job_end(&j);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ps");
    TCase *t = tcase_create("consistency");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_sync_sgd_exact);
    tcase_add_test(t, test_sync_adam_exact_one_shard);
    tcase_add_test(t, test_sync_half_and_lz4_exact);
    tcase_add_test(t, test_sync_split_rank_exact);
    tcase_add_test(t, test_sync_sparse_exact);
    tcase_add_test(t, test_async_applies_every_push);
    tcase_add_test(t, test_ssp_holds_the_fast_rank);
    tcase_add_test(t, test_nan_gradient_pushes_nothing);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
