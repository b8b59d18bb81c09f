/* The parameter server against bad input and failures, in one process on 127.0.0.1: a hostile
 * rank (a real member of the job, talking to the shards with a bare socket) sends every kind of
 * bad push and pull: each is refused with an error naming the problem and counted, and the
 * real ranks train on, their parameters exactly those of a run without the bad messages. A
 * rank 0 that never pushes its initial parameters makes the others time out naming it; a rank
 * that dies fails the waiting pulls with its name. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_ps.h"
#include "fl_tp.h"
#include "ps_int.h"
#include "testutil.h"

#define N 4000
#define JOB "flodl"

#define ASSERT_HAS(text, needle)                                                                   \
    ck_assert_msg(strstr((text), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (text),      \
                  (needle))

static fl_coord_t *coord;
static fl_ps_server_t *srv;
static char endpoint[FL_ENDPOINT_MAX];

static void start(int world, int shards, int hb_timeout_ms)
{
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = world;
    co.num_shards = shards;
    co.heartbeat_timeout_ms = hb_timeout_ms;
    co.rendezvous_timeout_ms = 20000;
    co.log_level = FL_LOG_OFF;
    ck_assert(fl_coord_create(&co, &coord) == FL_OK);
    ck_assert(fl_coord_start(coord) == FL_OK);
    snprintf(endpoint, sizeof endpoint, "%s", fl_coord_endpoint(coord));
    fl_ps_server_opts_t so;
    fl_ps_server_opts_init(&so);
    so.coordinator = endpoint;
    so.host = "127.0.0.1";
    so.num_shards = shards;
    so.shard_count = shards;
    fl_lr_sched_init(&so.lr, 0.5);
    so.rendezvous_timeout_ms = 20000;
    so.log_level = FL_LOG_OFF;
    ck_assert_msg(fl_ps_server_create(&so, &srv) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_ps_server_start(srv) == FL_OK);
}

static void stop(void)
{
    fl_ps_server_stop(srv);
    fl_ps_server_destroy(&srv);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
}

static void grad_of(int r, uint64_t t, float *g)
{
    for (int i = 0; i < N; i++)
        g[i] = (float)((i * 7 + r * 13 + (int)t * 5) % 64 - 32) / 64.0f;
}

/* ---- real ranks ---- */

typedef struct rank_arg {
    int rank, world, steps;
    int timeout_ms;
    float params[N];
    int rc;
    char err[1024];
} rank_arg_t;

static void *real_rank(void *p)
{
    rank_arg_t *a = p;
    fl_ps_client_opts_t o;
    fl_ps_client_opts_init(&o);
    o.rank = a->rank;
    o.world_size = a->world;
    o.coordinator = endpoint;
    o.host = "127.0.0.1";
    o.param_count = N;
    o.timeout_ms = a->timeout_ms ? a->timeout_ms : 15000;
    o.rendezvous_timeout_ms = 20000;
    o.reconnect_timeout_ms = 0;
    o.log_level = FL_LOG_OFF;
    fl_ps_client_t *cl = NULL;
    a->rc = fl_ps_client_create(&o, &cl);
    if (a->rc != FL_OK) {
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
        return NULL;
    }
    for (int i = 0; i < N; i++)
        a->params[i] = 1.0f;
    a->rc = fl_ps_client_init(cl, a->params);
    static _Thread_local float g[N];
    while (a->rc == FL_OK && (int)fl_ps_client_step(cl) < a->steps) {
        grad_of(a->rank, fl_ps_client_step(cl), g);
        fl_ps_grad_t grad = {.dense = g, .batch = 4};
        a->rc = fl_ps_client_push_pull(cl, &grad, a->params);
    }
    if (a->rc != FL_OK)
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
    fl_ps_client_destroy(&cl);
    return NULL;
}

/* ---- the hostile rank ---- */

typedef struct hostile {
    fl_ctx_t *ctx;
    fl_tp_member_t *member;
    fl_msg_hdr_t welcome;
    int rank;
    int world;
    int join_rc;
} hostile_t;

static void *hostile_join(void *p)
{
    hostile_t *h = p;
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = endpoint;
    mo.name = "hostile";
    mo.sender = h->rank;
    mo.rendezvous_timeout_ms = 20000;
    ck_assert(fl_tp_member_create(h->ctx, &mo, &h->member) == FL_OK);
    fl_msg_register_t reg;
    memset(&reg, 0, sizeof reg);
    reg.rank = h->rank;
    reg.world_size = h->world;
    snprintf(reg.host, sizeof reg.host, "hostile-host");
    reg.pid = getpid();
    reg.param_count = N;
    snprintf(reg.tuning, sizeof reg.tuning, "ps");
    h->join_rc = fl_tp_member_join(h->member, &reg, &h->welcome);
    if (h->join_rc == FL_OK)
        h->join_rc = fl_tp_member_start(h->member);
    return NULL;
}

static fl_tp_sock_t *open_shard(hostile_t *h, int shard, int sender, uint64_t gen, const char *job)
{
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *s = NULL;
    ck_assert(fl_tp_sock_create(h->ctx, FL_TP_DEALER, &t, "hostile", &s) == FL_OK);
    ck_assert(fl_tp_sock_connect(s, h->welcome.u.welcome.shards[shard].endpoint) == FL_OK);
    fl_tp_sock_set_stamp(s, job, gen, sender);
    return s;
}

static uint64_t seq_no;

static void *raw_alloc(size_t len, void *ud)
{
    void **p = ud;
    *p = malloc(len ? len : 1);
    return *p;
}

/* Sends a push (kind, step, payload) to shard s's range (or another range). */
static void push(fl_tp_sock_t *s, const fl_msg_shard_t *range, fl_msg_push_kind_t kind,
                 uint64_t step, const void *data, size_t bytes, uint32_t dtype, uint32_t codec,
                 uint64_t raw)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_PUSH, 0);
    h.seq = ++seq_no;
    h.u.push = (fl_msg_push_t){range->index, range->offset, range->count, step, 4, kind, false};
    fl_buf_t f = {(void *)data, bytes, NULL, NULL};
    h.nframes = data != NULL ? 1 : 0;
    h.frames[0] = (fl_msg_frame_t){bytes, dtype, codec, raw};
    ck_assert_msg(fl_tp_send(s, NULL, &h, data != NULL ? &f : NULL, h.nframes,
                             fl_deadline_in(2000)) == FL_OK,
                  "%s", fl_last_error());
}

/* The next answer to the last request: an error with code, whose text is copied out. */
static void expect_error(fl_tp_sock_t *s, int code, char *text, size_t cap)
{
    int64_t deadline = fl_deadline_in(3000);
    for (;;) {
        fl_tp_msg_t m;
        int rc = fl_tp_recv(s, &m, deadline);
        ck_assert_msg(rc == FL_OK, "no answer: %s", fl_last_error());
        if (m.hdr.type == FL_MSG_ERROR && (m.hdr.seq == seq_no || m.hdr.seq == 0)) {
            snprintf(text, cap, "%s", m.hdr.u.error.text);
            int got = m.hdr.u.error.code;
            fl_tp_msg_close(&m);
            ck_assert_msg(got == code, "code %d, expected %d: %s", got, code, text);
            return;
        }
        char what[FL_MSG_TEXT_MAX + 64];
        fl_test_describe_msg(&m, what, sizeof what);
        fl_tp_msg_close(&m);
        ck_abort_msg("expected an error, got %s", what);
    }
}

static void expect_ack(fl_tp_sock_t *s)
{
    fl_tp_msg_t m;
    fl_test_expect_msg(s, FL_MSG_PUSH_ACK, 3000, &m);
    fl_tp_msg_close(&m);
}

START_TEST(test_bad_pushes_and_pulls_are_refused)
{
    enum { W = 3, STEPS = 3, HOSTILE = 2 };
    start(W, 2, 3000);
    static rank_arg_t ranks[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&ranks[r], 0, sizeof ranks[r]);
        ranks[r].rank = r;
        ranks[r].world = W;
        ranks[r].steps = STEPS;
        ck_assert(pthread_create(&th[r], NULL, real_rank, &ranks[r]) == 0);
    }
    hostile_t h;
    memset(&h, 0, sizeof h);
    h.rank = HOSTILE;
    h.world = W;
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    ck_assert(fl_ctx_create(&co, &h.ctx) == FL_OK);
    hostile_join(&h);
    ck_assert_msg(h.join_rc == FL_OK, "%s", fl_last_error());
    const fl_msg_welcome_t *w = &h.welcome.u.welcome;
    uint64_t gen = h.welcome.generation;
    const fl_msg_shard_t *s0 = &w->shards[0], *s1 = &w->shards[1];
    fl_tp_sock_t *x = open_shard(&h, 0, HOSTILE, gen, JOB);
    static float g[N];
    char text[FL_MSG_TEXT_MAX];
    size_t bytes0 = (size_t)s0->count * 4;

    /* Before anything valid: an init push from a rank that is not 0. */
    grad_of(HOSTILE, 0, g);
    push(x, s0, FL_PUSH_INIT, 0, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "only rank 0");

    /* Rank 0's parameters may not be there yet: wait until a valid pull for step 0 works. */
    fl_msg_hdr_t hp;
    fl_msg_hdr_init(&hp, FL_MSG_PULL, 0);
    hp.u.pull = (fl_msg_pull_t){0, s0->offset, s0->count, 0, true, 10000, false};
    hp.seq = ++seq_no;
    ck_assert(fl_tp_send(x, NULL, &hp, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    fl_tp_msg_t m;
    fl_test_expect_msg(x, FL_MSG_PULL_REPLY, 10000, &m);
    fl_tp_msg_close(&m);

    /* A range that is not this shard's. */
    push(x, s1, FL_PUSH_GRADIENT, 0, g, (size_t)s1->count * 4, FL_FLOAT32, FL_CODEC_RAW,
         (size_t)s1->count * 4);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "names shard 1");
    ASSERT_HAS(text, "this is shard 0");

    /* A step in the future (sync: beyond the staleness bound 0). */
    push(x, s0, FL_PUSH_GRADIENT, 5, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "step 5");
    ASSERT_HAS(text, "staleness bound 0");

    /* NaN and Inf. */
    float saved = g[7];
    g[7] = 0.0f / 0.0f;
    push(x, s0, FL_PUSH_GRADIENT, 0, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
    expect_error(x, FL_ENONFINITE, text, sizeof text);
    ASSERT_HAS(text, "NaN at index 7");
    g[7] = saved;

    /* The wrong size of dense payload, and an unknown dtype. */
    push(x, s0, FL_PUSH_GRADIENT, 0, g, bytes0 - 4, FL_FLOAT32, FL_CODEC_RAW, bytes0 - 4);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "bytes for a shard of");
    push(x, s0, FL_PUSH_GRADIENT, 0, g, bytes0, FL_INT32, FL_CODEC_RAW, bytes0);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "int32");

    /* A sparse block for another tensor size, and sparse garbage. */
    fl_cmp_ws_t *ws = NULL;
    ck_assert(fl_cmp_ws_create(&ws) == FL_OK);
    uint32_t idx[2] = {3, (uint32_t)s0->count};
    float val[2] = {1, 2};
    fl_cmp_sparse_opts_t so;
    fl_cmp_sparse_opts_init(&so);
    uint8_t block[256];
    size_t len;
    ck_assert(fl_cmp_sparse_encode(ws, idx, val, 2, (size_t)s0->count + 1, &so, block, sizeof block,
                                   &len) == FL_OK);
    push(x, s0, FL_PUSH_GRADIENT, 0, block, len, FL_FLOAT32, FL_CODEC_SPARSE, len);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "sparse push for a tensor of");
    /* An index beyond the shard: a valid block for the shard whose first delta is raised, so
     * the last index lands past the end (sizes unchanged). */
    uint32_t idx2[2] = {3, (uint32_t)s0->count - 1};
    so.lz4 = false;
    ck_assert(fl_cmp_sparse_encode(ws, idx2, val, 2, (size_t)s0->count, &so, block, sizeof block,
                                   &len) == FL_OK);
    ck_assert_uint_eq(block[FL_CMP_SPARSE_HEADER], 3);
    block[FL_CMP_SPARSE_HEADER] = 0x70;
    push(x, s0, FL_PUSH_GRADIENT, 0, block, len, FL_FLOAT32, FL_CODEC_SPARSE, len);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "outside 0..1999");
    memset(block, 0x5a, 64);
    push(x, s0, FL_PUSH_GRADIENT, 0, block, 64, FL_FLOAT32, FL_CODEC_SPARSE, 64);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "sparse block");
    fl_cmp_ws_destroy(&ws);

    /* A pull for a step beyond its own pushes could never be answered. */
    hp.u.pull = (fl_msg_pull_t){0, s0->offset, s0->count, 3, false, 1000, false};
    hp.seq = ++seq_no;
    ck_assert(fl_tp_send(x, NULL, &hp, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    expect_error(x, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "step 3");

    /* Not a message for a shard. */
    fl_msg_hdr_t hb;
    fl_msg_hdr_init(&hb, FL_MSG_BARRIER, 0);
    hb.seq = ++seq_no;
    ck_assert(fl_tp_send(x, NULL, &hb, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    expect_error(x, FL_EPROTO, text, sizeof text);
    ASSERT_HAS(text, "unexpected barrier");

    /* Frames unlike the header, another generation, another job, a rank out of range, and a
     * second connection claiming the hostile's rank: each on its own socket. */
    fl_tp_sock_t *y = open_shard(&h, 0, HOSTILE, gen + 1, JOB);
    push(y, s0, FL_PUSH_GRADIENT, 0, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
    expect_error(y, FL_EPROTO, text, sizeof text);
    ASSERT_HAS(text, "generation");
    fl_tp_sock_destroy(&y);
    y = open_shard(&h, 0, HOSTILE, gen, "other-job");
    push(y, s0, FL_PUSH_GRADIENT, 0, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
    expect_error(y, FL_EPROTO, text, sizeof text);
    ASSERT_HAS(text, "other-job");
    fl_tp_sock_destroy(&y);
    y = open_shard(&h, 0, 7, gen, JOB);
    push(y, s0, FL_PUSH_GRADIENT, 0, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
    expect_error(y, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "rank 7, which is not a rank of this job");
    fl_tp_sock_destroy(&y);
    y = open_shard(&h, 0, HOSTILE, gen, JOB);
    push(y, s0, FL_PUSH_GRADIENT, 0, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
    expect_error(y, FL_EINVAL, text, sizeof text);
    ASSERT_HAS(text, "another connection");
    fl_tp_sock_destroy(&y);
    y = open_shard(&h, 0, HOSTILE, gen, JOB);
    {
        fl_msg_hdr_t hh;
        fl_msg_hdr_init(&hh, FL_MSG_PUSH, HOSTILE);
        snprintf(hh.job_id, sizeof hh.job_id, JOB);
        hh.generation = gen;
        hh.seq = ++seq_no;
        hh.u.push = (fl_msg_push_t){0, s0->offset, s0->count, 0, 4, FL_PUSH_GRADIENT, false};
        hh.nframes = 1;
        hh.frames[0] = (fl_msg_frame_t){100, FL_FLOAT32, FL_CODEC_RAW, 100};
        void *enc = NULL;
        size_t elen = 0;
        ck_assert(fl_msg_encode(&hh, raw_alloc, &enc, &elen) == FL_OK);
        const void *parts[3] = {enc, g, g};
        size_t sizes[3] = {elen, 100, 100};
        ck_assert(fl_tp_send_raw(y, parts, sizes, 3) == FL_OK);
        free(enc);
        expect_error(y, FL_EPROTO, text, sizeof text);
        ASSERT_HAS(text, "declares 1 payload frames but 2 arrived");
    }
    fl_tp_sock_destroy(&y);

    /* The hostile's valid pushes; the real ranks finish their steps. */
    fl_tp_sock_t *x1 = open_shard(&h, 1, HOSTILE, gen, JOB);
    for (uint64_t t = 0; t < STEPS; t++) {
        grad_of(HOSTILE, t, g);
        push(x, s0, FL_PUSH_GRADIENT, t, g, bytes0, FL_FLOAT32, FL_CODEC_RAW, bytes0);
        expect_ack(x);
        push(x1, s1, FL_PUSH_GRADIENT, t, g + s1->offset, (size_t)s1->count * 4, FL_FLOAT32,
             FL_CODEC_RAW, (size_t)s1->count * 4);
        expect_ack(x1);
        /* As a real client: the next push only once this step is complete (sync). */
        fl_tp_sock_t *xs[2] = {x, x1};
        const fl_msg_shard_t *ss[2] = {s0, s1};
        for (int k = 0; k < 2; k++) {
            hp.u.pull = (fl_msg_pull_t){ss[k]->index, ss[k]->offset, ss[k]->count, t + 1,
                                        false,        10000,         false};
            hp.seq = ++seq_no;
            ck_assert(fl_tp_send(xs[k], NULL, &hp, NULL, 0, fl_deadline_in(1000)) == FL_OK);
            fl_test_expect_msg(xs[k], FL_MSG_PULL_REPLY, 15000, &m);
            fl_tp_msg_close(&m);
        }
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(ranks[r].rc == FL_OK, "rank %d: %s", r, ranks[r].err);

    /* What a run without the bad messages gives: plain SGD, lr 0.5, mean of three. */
    static float p[N], gg[3][N];
    for (int i = 0; i < N; i++)
        p[i] = 1.0f;
    fl_opt_opts_t oo;
    fl_opt_opts_init(&oo);
    fl_opt_t *opt = NULL;
    ck_assert(fl_opt_create(&oo, N, &opt) == FL_OK);
    for (int t = 0; t < STEPS; t++) {
        float avg[N];
        for (int r = 0; r < 3; r++)
            grad_of(r, (uint64_t)t, gg[r]);
        for (int i = 0; i < N; i++)
            avg[i] = ((gg[0][i] + gg[1][i]) + gg[2][i]) / 3.0f;
        ck_assert(fl_opt_step(opt, p, avg, 0.5) == FL_OK);
    }
    fl_opt_destroy(&opt);
    ck_assert_int_eq(memcmp(ranks[0].params, p, sizeof p), 0);
    ck_assert_int_eq(memcmp(ranks[1].params, p, sizeof p), 0);

    fl_ps_server_stats_t st;
    fl_ps_server_get_stats(srv, &st);
    ck_assert_msg(st.refused >= 15, "%llu refused", (unsigned long long)st.refused);
    ck_assert_msg(st.bad_msgs >= 2, "%llu bad messages", (unsigned long long)st.bad_msgs);
    fl_tp_sock_destroy(&x);
    fl_tp_sock_destroy(&x1);
    fl_tp_member_stop(h.member, 0, "done");
    fl_tp_member_destroy(&h.member);
    fl_msg_hdr_deinit(&h.welcome);
    fl_ctx_destroy(&h.ctx);
    stop();
}
END_TEST

/* The client checks what it says of itself as the communicator does (member_opts.c), before it
 * connects anywhere: a job id that is not wire text never reaches a server. */
START_TEST(test_client_identity_is_checked)
{
    fl_ps_client_opts_t o;
    fl_ps_client_opts_init(&o);
    o.rank = 0;
    o.world_size = 1;
    o.coordinator = "tcp://127.0.0.1:9";
    o.param_count = N;
    o.log_level = FL_LOG_OFF;
    fl_ps_client_t *cl = NULL;
    o.job_id = "job\nx";
    ck_assert_int_eq(fl_ps_client_create(&o, &cl), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "ps client: job_id must be UTF-8 without control characters");
    o.job_id = JOB;
    o.rank = 1;
    ck_assert_int_eq(fl_ps_client_create(&o, &cl), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "ps client: rank 1 out of range 0..0");
    o.rank = 0;
    o.coordinator = "smtp://127.0.0.1:25";
    ck_assert_int_eq(fl_ps_client_create(&o, &cl), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "ps client: rank 0: coordinator");
    ck_assert_ptr_null(cl);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ps_bad");
    TCase *t = tcase_create("bad input");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_bad_pushes_and_pulls_are_refused);
    tcase_add_test(t, test_client_identity_is_checked);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
