/* The coordinator's parameter-server side (server/coord_ps.c) with servers and ranks played by
 * bare DEALER sockets: the shard map every member receives, the settings and the resume step
 * it carries, every refusal of a server or a rank (naming both sides), the missing shards in
 * the rendezvous progress, a job that cannot start, a server that dies or leaves mid-job, the
 * end of a job; and the shard map arithmetic itself (server/ps_map.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "testutil.h"

#define JOB "ps-test"
#define MAX_FAKES 12

#define ASSERT_HAS(text, needle)                                                                   \
    ck_assert_msg(strstr((text), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (text),      \
                  (needle))
#define ASSERT_HASNT(text, needle)                                                                 \
    ck_assert_msg(strstr((text), (needle)) == NULL, "\"%s\" reveals \"%s\"", (text), (needle))

typedef struct env {
    fl_coord_t *coord;
    fl_ctx_t *ctx;
    fl_tp_sock_t *fakes[MAX_FAKES];
    int nfakes;
} env_t;

static void env_start(env_t *e, int world, int nshards, uint64_t init_params, int hb_timeout)
{
    memset(e, 0, sizeof *e);
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = world;
    o.job_id = JOB;
    o.heartbeat_timeout_ms = hb_timeout > 0 ? hb_timeout : 3000;
    o.rendezvous_timeout_ms = 30000;
    o.log_level = FL_LOG_OFF;
    o.num_shards = nshards;
    o.param_count = init_params;
    ck_assert_msg(fl_coord_create(&o, &e->coord) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(fl_coord_start(e->coord) == FL_OK, "%s", fl_last_error());
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    ck_assert(fl_ctx_create(&co, &e->ctx) == FL_OK);
}

static void env_end(env_t *e)
{
    for (int i = 0; i < e->nfakes; i++)
        fl_tp_sock_destroy(&e->fakes[i]);
    fl_ctx_destroy(&e->ctx);
    fl_coord_stop(e->coord);
    fl_coord_destroy(&e->coord);
}

static fl_tp_sock_t *fake_open(env_t *e)
{
    ck_assert(e->nfakes < MAX_FAKES);
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *s = NULL;
    ck_assert(fl_tp_sock_create(e->ctx, FL_TP_DEALER, &t, "fake", &s) == FL_OK);
    ck_assert(fl_tp_sock_connect(s, fl_coord_endpoint(e->coord)) == FL_OK);
    e->fakes[e->nfakes++] = s;
    return s;
}

/* A parameter-server client: no data endpoint, its parameter count. */
static void send_worker(fl_tp_sock_t *s, int rank, int world, uint64_t params)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, rank);
    snprintf(h.job_id, sizeof h.job_id, JOB);
    h.u.reg.rank = rank;
    h.u.reg.world_size = world;
    snprintf(h.u.reg.host, sizeof h.u.reg.host, "worker-%d", rank);
    h.u.reg.pid = 500 + rank;
    snprintf(h.u.reg.tuning, sizeof h.u.reg.tuning, "ps");
    h.u.reg.param_count = params;
    ck_assert(fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
}

/* A worker describing its model's tensors, as flodl-worker does. */
static void send_worker_model(fl_tp_sock_t *s, int rank, int world, uint64_t params,
                              const char *shapes)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, rank);
    snprintf(h.job_id, sizeof h.job_id, JOB);
    h.u.reg.rank = rank;
    h.u.reg.world_size = world;
    snprintf(h.u.reg.host, sizeof h.u.reg.host, "worker-%d", rank);
    h.u.reg.pid = 500 + rank;
    snprintf(h.u.reg.tuning, sizeof h.u.reg.tuning, "ps");
    h.u.reg.param_count = params;
    h.u.reg.model_signature = fl_model_shapes_signature(shapes);
    snprintf(h.u.reg.model_shapes, sizeof h.u.reg.model_shapes, "%s", shapes);
    ck_assert(fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
}

typedef struct server_spec {
    int first;
    int count;
    int num_shards;
    uint64_t params;
    const char *tuning;
    uint32_t consistency;
    uint32_t staleness;
    int nckpt;
    uint64_t ckpt[4];
    int pid;
    const char *job;    /* NULL: JOB */
    const char *shapes; /* its --init file's tensors (NULL: none), named init.safetensors */
    const char *host;   /* NULL: "ps-<first>" */
    const char *token;  /* NULL: none (a first registration) */
} server_spec_t;

static server_spec_t server_of(int first, int count, int num_shards)
{
    server_spec_t v = {first, count, num_shards, 0,   "opt=sgd,lr=0.1", 0, 0, 0, {0}, 900 + first,
                       NULL,  NULL,  NULL,       NULL};
    return v;
}

static void send_server(fl_tp_sock_t *s, const server_spec_t *v)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, FL_MSG_SENDER_SERVER);
    snprintf(h.job_id, sizeof h.job_id, "%s", v->job != NULL ? v->job : JOB);
    fl_msg_register_t *r = &h.u.reg;
    r->role = FL_ROLE_SERVER;
    r->rank = v->first;
    r->shard_count = (uint32_t)v->count;
    r->num_shards = (uint32_t)v->num_shards;
    if (v->host != NULL)
        snprintf(r->host, sizeof r->host, "%s", v->host);
    else
        snprintf(r->host, sizeof r->host, "ps-%d", v->first);
    r->pid = v->pid;
    if (v->token != NULL)
        snprintf(r->token, sizeof r->token, "%s", v->token);
    snprintf(r->tuning, sizeof r->tuning, "%s", v->tuning);
    r->param_count = v->params;
    r->consistency = v->consistency;
    r->staleness = v->staleness;
    r->ckpt_every_steps = 100;
    ck_assert(fl_msg_register_alloc_shards(r, (uint32_t)v->count) == FL_OK);
    for (int i = 0; i < v->count; i++)
        snprintf(r->shard_eps[i], FL_ENDPOINT_MAX, "tcp://10.9.0.%d:%d", v->first, 7000 + i);
    r->ncheckpoints = (uint32_t)v->nckpt;
    for (int i = 0; i < v->nckpt; i++)
        r->checkpoints[i] = v->ckpt[i];
    if (v->shapes != NULL) {
        r->model_signature = fl_model_shapes_signature(v->shapes);
        snprintf(r->model_shapes, sizeof r->model_shapes, "%s/tmp/init.safetensors;%s",
                 FL_PS_INIT_FILE_TAG, v->shapes);
    }
    int rc = fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000));
    fl_msg_hdr_deinit(&h);
    ck_assert_msg(rc == FL_OK, "%s", fl_last_error());
}

static void send_ctl(fl_tp_sock_t *s, fl_msg_type_t type, int sender, int code)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, type, sender);
    snprintf(h.job_id, sizeof h.job_id, JOB);
    if (type == FL_MSG_SHUTDOWN) {
        h.u.shutdown.code = code;
        snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text, "bye from %d", sender);
    }
    ck_assert(fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
}

static void expect_error(fl_tp_sock_t *s, int code, fl_msg_error_t *out)
{
    fl_tp_msg_t m;
    fl_test_expect_msg(s, FL_MSG_ERROR, 3000, &m);
    *out = m.hdr.u.error;
    fl_tp_msg_close(&m);
    ck_assert_msg(out->code == code, "code %d, expected %d: %s", out->code, code, out->text);
}

/* The welcome on s, copied into *w (caller deinits). */
static void expect_welcome(fl_tp_sock_t *s, fl_msg_hdr_t *w)
{
    fl_tp_msg_t m;
    fl_test_expect_msg(s, FL_MSG_WELCOME, 3000, &m);
    ck_assert(fl_msg_hdr_copy(w, &m.hdr) == FL_OK);
    fl_tp_msg_close(&m);
}

static int wait_finished(fl_coord_t *c, int ms)
{
    return fl_coord_wait(c, ms);
}

START_TEST(test_shard_map_reaches_everyone)
{
    env_t e;
    env_start(&e, 2, 3, 0, 0);
    fl_tp_sock_t *w0 = fake_open(&e), *w1 = fake_open(&e);
    fl_tp_sock_t *sa = fake_open(&e), *sb = fake_open(&e);
    server_spec_t a = server_of(0, 2, 3), b = server_of(2, 1, 3);
    a.consistency = b.consistency = 2;
    a.staleness = b.staleness = 4;
    send_server(sb, &b);
    send_worker(w0, 0, 2, 1000);
    send_server(sa, &a);
    send_worker(w1, 1, 2, 1000);
    fl_msg_hdr_t w[4];
    expect_welcome(w0, &w[0]);
    expect_welcome(w1, &w[1]);
    expect_welcome(sa, &w[2]);
    expect_welcome(sb, &w[3]);
    uint64_t gen = w[0].generation;
    for (int k = 0; k < 4; k++) {
        const fl_msg_welcome_t *x = &w[k].u.welcome;
        ck_assert_uint_eq(x->npeers, 2);
        ck_assert_uint_eq(x->nshards, 3);
        ck_assert_uint_eq(x->param_count, 1000);
        ck_assert_uint_eq(x->consistency, 2);
        ck_assert_uint_eq(x->staleness, 4);
        ck_assert_uint_eq(x->ckpt_every_steps, 100);
        ck_assert(!x->resume);
        uint64_t next = 0;
        for (uint32_t i = 0; i < 3; i++) {
            const fl_msg_shard_t *s = &x->shards[i];
            fl_ps_range_t r;
            fl_ps_map_range(1000, 3, i, &r);
            ck_assert_uint_eq(s->index, i);
            ck_assert_uint_eq(s->offset, r.offset);
            ck_assert_uint_eq(s->count, r.count);
            ck_assert_uint_eq(s->offset, next);
            next += s->count;
        }
        ck_assert_uint_eq(next, 1000);
        ck_assert_str_eq(x->shards[0].endpoint, "tcp://10.9.0.0:7000");
        ck_assert_str_eq(x->shards[1].endpoint, "tcp://10.9.0.0:7001");
        ck_assert_str_eq(x->shards[2].endpoint, "tcp://10.9.0.2:7000");
        ck_assert_str_eq(x->shards[2].host, "ps-2");
        ck_assert_uint_eq(w[k].generation, gen);
        fl_msg_hdr_deinit(&w[k]);
    }
    ck_assert_int_eq(fl_coord_servers_active(e.coord), 2);

    /* The job ends when the ranks leave: the servers are told it is over (code 0). */
    send_ctl(w0, FL_MSG_SHUTDOWN, 0, 0);
    send_ctl(w1, FL_MSG_SHUTDOWN, 1, 0);
    fl_tp_msg_t m;
    fl_test_expect_msg(sa, FL_MSG_SHUTDOWN, 3000, &m);
    ck_assert_int_eq(m.hdr.u.shutdown.code, 0);
    ASSERT_HAS(m.hdr.u.shutdown.text, "over");
    fl_tp_msg_close(&m);
    fl_test_expect_msg(sb, FL_MSG_SHUTDOWN, 3000, &m);
    ck_assert_int_eq(m.hdr.u.shutdown.code, 0);
    fl_tp_msg_close(&m);
    ck_assert_int_eq(wait_finished(e.coord, 3000), FL_OK);
    env_end(&e);
}
END_TEST

START_TEST(test_server_refusals)
{
    env_t e;
    env_start(&e, 1, 4, 0, 0);
    fl_tp_sock_t *good = fake_open(&e), *x = fake_open(&e);
    fl_msg_error_t err;
    server_spec_t g = server_of(0, 2, 4);
    g.params = 5000;
    send_server(good, &g);

    server_spec_t v = server_of(0, 1, 8);
    send_server(x, &v);
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "8 shards");
    ASSERT_HAS(err.text, "expects 4");

    v = server_of(3, 2, 4);
    send_server(x, &v);
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "3..4");
    ASSERT_HAS(err.text, "0..3");

    v = server_of(1, 2, 4); /* overlaps shards 0..1: nothing said of their server */
    send_server(x, &v);
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "1..2");
    ASSERT_HASNT(err.text, "ps-0");
    ASSERT_HASNT(err.text, "900");

    v = server_of(2, 2, 4);
    v.tuning = "opt=adam,lr=0.1";
    send_server(x, &v);
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "opt=adam");
    ASSERT_HAS(err.text, "opt=sgd");

    v = server_of(2, 2, 4);
    v.consistency = 1;
    send_server(x, &v);
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "consistency=async");
    ASSERT_HAS(err.text, "consistency=sync");

    v = server_of(2, 2, 4);
    v.params = 5001;
    send_server(x, &v);
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "5001");
    ASSERT_HAS(err.text, "5000");

    /* A server of another job: refused, and counted with the foreign messages. */
    v = server_of(2, 2, 4);
    v.job = "other-job";
    send_server(x, &v);
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "'other-job'");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_JOB), 1);

    /* A rank with another parameter count than the servers'. */
    fl_tp_sock_t *w = fake_open(&e);
    send_worker(w, 0, 1, 4999);
    expect_error(w, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "rank 0");
    ASSERT_HAS(err.text, "4999");
    ASSERT_HAS(err.text, "5000");
    ASSERT_HAS(err.text, "different models");
    ASSERT_HASNT(err.text, "ps-0"); /* the server it disagrees with, by its shards only */
    ASSERT_HASNT(err.text, "900");

    /* The refused socket can still register correctly, and the job starts. */
    v = server_of(2, 2, 4);
    send_server(x, &v);
    send_worker(w, 0, 1, 5000);
    fl_msg_hdr_t h;
    expect_welcome(w, &h);
    ck_assert_uint_eq(h.u.welcome.nshards, 4);
    fl_msg_hdr_deinit(&h);

    /* Too late to join. */
    fl_tp_sock_t *late = fake_open(&e);
    v = server_of(0, 1, 4);
    v.pid = 4444;
    send_server(late, &v);
    expect_error(late, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "ps-0");
    env_end(&e);
}
END_TEST

/* The server role cannot be taken over. A stranger claiming the shards a live server holds
 * is refused without a word about that server; repeating the server's host and pid proves
 * nothing either: no welcome, no peer table, no generation, and the job goes on. The server
 * itself, on a new connection, comes back with the token of its welcome. */
START_TEST(test_server_role_takeover)
{
    env_t e;
    env_start(&e, 1, 2, 0, 0);
    fl_tp_sock_t *sa = fake_open(&e), *w = fake_open(&e), *x = fake_open(&e);
    server_spec_t v = server_of(0, 2, 2);
    v.params = 5000;
    send_server(sa, &v);
    send_worker(w, 0, 1, 5000);
    fl_msg_hdr_t h;
    expect_welcome(sa, &h);
    char token[FL_MSG_TOKEN_MAX];
    snprintf(token, sizeof token, "%s", h.u.welcome.token);
    fl_msg_hdr_deinit(&h);
    expect_welcome(w, &h);
    char wtoken[FL_MSG_TOKEN_MAX];
    snprintf(wtoken, sizeof wtoken, "%s", h.u.welcome.token);
    fl_msg_hdr_deinit(&h);

    server_spec_t claim = v;
    claim.host = "stranger";
    claim.pid = 4444;
    server_spec_t again = v; /* the server's own host and pid, as the first refusal once told */
    server_spec_t forged = v;
    forged.token = "00000000000000000000000000000000";
    const server_spec_t *tries[] = {&claim, &again, &forged};
    for (int i = 0; i < 3; i++) {
        send_server(x, tries[i]);
        fl_tp_msg_t m;
        fl_test_expect_msg(x, FL_MSG_ERROR, 3000, &m); /* a welcome fails here */
        fl_msg_error_t err = m.hdr.u.error;
        uint64_t gen = m.hdr.generation;
        fl_tp_msg_close(&m);
        ck_assert_int_eq(err.code, FL_EINVAL);
        ck_assert_msg(gen == 0, "try %d: the refusal carries generation %llu", i,
                      (unsigned long long)gen);
        ASSERT_HAS(err.text, "0..1");
        if (i == 0) {
            ASSERT_HASNT(err.text, "ps-0");
            ASSERT_HASNT(err.text, "900");
        }
    }
    ck_assert_uint_eq(strlen(token), FL_MSG_TOKEN_MAX - 1);
    ck_assert_str_ne(wtoken, token); /* each member its own */
    send_ctl(sa, FL_MSG_HEARTBEAT, FL_MSG_SENDER_SERVER, 0);
    send_ctl(w, FL_MSG_HEARTBEAT, 0, 0);
    ck_assert_int_eq(fl_coord_servers_active(e.coord), 1);
    ck_assert_int_eq(wait_finished(e.coord, 300), FL_ETIMEDOUT);

    fl_tp_sock_t *back = fake_open(&e);
    server_spec_t own = v;
    own.token = token;
    send_server(back, &own);
    expect_welcome(back, &h);
    ck_assert_str_eq(h.u.welcome.token, token);
    fl_msg_hdr_deinit(&h);
    ck_assert_int_eq(fl_coord_servers_active(e.coord), 1);
    ck_assert_int_eq(wait_finished(e.coord, 50), FL_ETIMEDOUT);
    env_end(&e);
}
END_TEST

START_TEST(test_no_parameter_server)
{
    env_t e;
    env_start(&e, 1, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    server_spec_t v = server_of(0, 1, 1);
    send_server(x, &v);
    fl_msg_error_t err;
    expect_error(x, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "no parameter server");
    env_end(&e);
}
END_TEST

START_TEST(test_missing_shards_in_progress)
{
    env_t e;
    env_start(&e, 1, 5, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *s = fake_open(&e);
    server_spec_t v = server_of(1, 2, 5);
    send_server(s, &v);
    send_worker(w, 0, 1, 64);
    /* The rank is in, shards 0 and 3..4 are not: the heartbeats say so. */
    int64_t deadline = fl_deadline_in(3000);
    char missing[FL_MSG_MISSING_MAX] = "";
    while (fl_now_ms() < deadline && strstr(missing, "shards") == NULL) {
        fl_tp_msg_t m;
        if (fl_tp_recv(w, &m, deadline) != FL_OK)
            continue;
        if (m.hdr.type == FL_MSG_HEARTBEAT)
            snprintf(missing, sizeof missing, "%s", m.hdr.u.heartbeat.missing);
        fl_tp_msg_close(&m);
    }
    ck_assert_str_eq(missing, "shards 0,3..4");
    env_end(&e);
}
END_TEST

START_TEST(test_unknown_param_count_fails_the_job)
{
    env_t e;
    env_start(&e, 1, 1, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *s = fake_open(&e);
    server_spec_t v = server_of(0, 1, 1);
    send_server(s, &v);
    send_worker(w, 0, 1, 0); /* a ring-style rank would need an endpoint: refused first */
    fl_msg_error_t err;
    expect_error(w, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "data endpoint");
    env_end(&e);

    /* With an endpoint but no count: the job cannot start, everyone is told why. */
    env_start(&e, 1, 1, 0, 0);
    w = fake_open(&e);
    s = fake_open(&e);
    v = server_of(0, 1, 1);
    send_server(s, &v);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, 0);
    snprintf(h.job_id, sizeof h.job_id, JOB);
    h.u.reg.world_size = 1;
    h.u.reg.nendpoints = 1;
    snprintf(h.u.reg.endpoints[0], FL_ENDPOINT_MAX, "tcp://127.0.0.1:9");
    ck_assert(fl_tp_send(w, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    expect_error(w, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "parameter count");
    expect_error(s, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "parameter count");
    ck_assert_int_eq(wait_finished(e.coord, 3000), FL_EINVAL);
    env_end(&e);
}
END_TEST

/* 20 parameters make two blocks of 16: four shards would leave two empty. */
START_TEST(test_too_many_shards_for_the_model)
{
    env_t e;
    env_start(&e, 1, 4, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *s = fake_open(&e);
    server_spec_t v = server_of(0, 4, 4);
    send_server(s, &v);
    send_worker(w, 0, 1, 20);
    fl_msg_error_t err;
    expect_error(w, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "20 parameters do not fill 4 shards");
    ASSERT_HAS(err.text, "at most 2 shards");
    ck_assert_int_eq(wait_finished(e.coord, 3000), FL_EINVAL);
    env_end(&e);
}
END_TEST

START_TEST(test_init_count_from_options)
{
    env_t e;
    env_start(&e, 1, 2, 77, 0);
    fl_tp_sock_t *w = fake_open(&e), *s = fake_open(&e);
    server_spec_t v = server_of(0, 2, 2);
    send_server(s, &v);
    send_worker(w, 0, 1, 78);
    fl_msg_error_t err;
    expect_error(w, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "--init");
    send_worker(w, 0, 1, 77);
    fl_msg_hdr_t h;
    expect_welcome(w, &h);
    ck_assert_uint_eq(h.u.welcome.param_count, 77);
    ck_assert_uint_eq(h.u.welcome.shards[0].count + h.u.welcome.shards[1].count, 77);
    fl_msg_hdr_deinit(&h);
    env_end(&e);
}
END_TEST

#define MODEL "layers.0.weight[32,16];layers.0.bias[32];"
#define TRANSPOSED "layers.0.weight[16,32];layers.0.bias[32];"

/* The parameter server's --init file against the ranks' model, tensor by tensor: a weight
 * declared transposed (the same parameter count) fails the rendezvous in either order, every
 * member told which tensor, both shapes and the file; the same tensors start the job; a rank
 * with a bare signature (no tensors described) is not compared with the file (comparing only the
 * counts let the transposed weight train). */
START_TEST(test_init_shapes_checked)
{
    static const char *const want[] = {"different models", "tensor 'layers.0.weight'",
                                       "[32,16] on rank 0 (host worker-0)",
                                       "[16,32] in /tmp/init.safetensors", NULL};
    for (int order = 0; order < 2; order++) {
        env_t e;
        env_start(&e, 1, 1, 0, 0);
        fl_tp_sock_t *w = fake_open(&e), *s = fake_open(&e);
        server_spec_t v = server_of(0, 1, 1);
        v.params = 544;
        v.shapes = TRANSPOSED;
        if (order == 0) {
            send_server(s, &v);
            usleep(100 * 1000);
            send_worker_model(w, 0, 1, 544, MODEL);
        } else {
            send_worker_model(w, 0, 1, 544, MODEL);
            usleep(100 * 1000);
            send_server(s, &v);
        }
        fl_msg_error_t err;
        expect_error(w, FL_EINVAL, &err);
        for (int i = 0; want[i] != NULL; i++)
            ASSERT_HAS(err.text, want[i]);
        expect_error(s, FL_EINVAL, &err);
        ASSERT_HAS(err.text, "tensor 'layers.0.weight'");
        ck_assert_int_eq(wait_finished(e.coord, 3000), FL_EINVAL);
        env_end(&e);
    }

    for (int bare = 0; bare < 2; bare++) {
        env_t e;
        env_start(&e, 1, 1, 0, 0);
        fl_tp_sock_t *w = fake_open(&e), *s = fake_open(&e);
        server_spec_t v = server_of(0, 1, 1);
        v.params = 544;
        v.shapes = MODEL;
        send_server(s, &v);
        if (bare)
            send_worker(w, 0, 1, 544); /* a client of its own: no tensors described */
        else
            send_worker_model(w, 0, 1, 544, MODEL);
        fl_msg_hdr_t h;
        expect_welcome(w, &h);
        fl_msg_hdr_deinit(&h);
        env_end(&e);
    }
}
END_TEST

START_TEST(test_resume_picks_newest_common_step)
{
    env_t e;
    env_start(&e, 1, 2, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *a = fake_open(&e), *b = fake_open(&e);
    server_spec_t va = server_of(0, 1, 2), vb = server_of(1, 1, 2);
    va.nckpt = 3;
    va.ckpt[0] = 300, va.ckpt[1] = 200, va.ckpt[2] = 100;
    vb.nckpt = 2;
    vb.ckpt[0] = 250, vb.ckpt[1] = 200;
    va.params = vb.params = 32;
    send_server(a, &va);
    send_server(b, &vb);
    send_worker(w, 0, 1, 32);
    fl_msg_hdr_t h;
    expect_welcome(a, &h);
    ck_assert(h.u.welcome.resume);
    ck_assert_uint_eq(h.u.welcome.resume_step, 200);
    fl_msg_hdr_deinit(&h);
    expect_welcome(w, &h);
    ck_assert_uint_eq(h.u.welcome.resume_step, 200);
    fl_msg_hdr_deinit(&h);
    env_end(&e);
}
END_TEST

START_TEST(test_resume_refusals)
{
    /* No common step. */
    env_t e;
    env_start(&e, 1, 2, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *a = fake_open(&e), *b = fake_open(&e);
    server_spec_t va = server_of(0, 1, 2), vb = server_of(1, 1, 2);
    va.nckpt = 1, va.ckpt[0] = 30;
    vb.nckpt = 1, vb.ckpt[0] = 20;
    send_server(a, &va);
    send_server(b, &vb);
    send_worker(w, 0, 1, 32);
    fl_msg_error_t err;
    expect_error(w, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "no checkpoint step");
    ASSERT_HAS(err.text, "30");
    ASSERT_HAS(err.text, "20");
    ck_assert_int_eq(wait_finished(e.coord, 3000), FL_EINVAL);
    env_end(&e);

    /* One server lost its checkpoints. */
    env_start(&e, 1, 2, 0, 0);
    w = fake_open(&e), a = fake_open(&e), b = fake_open(&e);
    va = server_of(0, 1, 2), vb = server_of(1, 1, 2);
    va.nckpt = 1, va.ckpt[0] = 30;
    send_server(a, &va);
    send_server(b, &vb);
    send_worker(w, 0, 1, 32);
    expect_error(b, FL_EINVAL, &err);
    ASSERT_HAS(err.text, "no checkpoint to resume from");
    ASSERT_HAS(err.text, "ps-1");
    ASSERT_HAS(err.text, "step 30");
    env_end(&e);
}
END_TEST

START_TEST(test_server_death_asks_for_restart)
{
    env_t e;
    env_start(&e, 2, 2, 0, 800);
    fl_tp_sock_t *w0 = fake_open(&e), *w1 = fake_open(&e), *a = fake_open(&e), *b = fake_open(&e);
    server_spec_t va = server_of(0, 1, 2), vb = server_of(1, 1, 2);
    send_server(a, &va);
    send_server(b, &vb);
    send_worker(w0, 0, 2, 100);
    send_worker(w1, 1, 2, 100);
    fl_msg_hdr_t h;
    expect_welcome(w0, &h);
    fl_msg_hdr_deinit(&h);
    expect_welcome(w1, &h);
    fl_msg_hdr_deinit(&h);
    expect_welcome(a, &h);
    fl_msg_hdr_deinit(&h);
    /* Everyone but server b keeps beating; b goes silent. */
    int64_t until = fl_now_ms() + 3000;
    fl_tp_msg_t m;
    bool got0 = false, got1 = false, gota = false;
    while (fl_now_ms() < until && !(got0 && got1 && gota)) {
        send_ctl(w0, FL_MSG_HEARTBEAT, 0, 0);
        send_ctl(w1, FL_MSG_HEARTBEAT, 1, 0);
        send_ctl(a, FL_MSG_HEARTBEAT, FL_MSG_SENDER_SERVER, 0);
        fl_tp_sock_t *socks[3] = {w0, w1, a};
        bool *got[3] = {&got0, &got1, &gota};
        for (int i = 0; i < 3; i++) {
            while (fl_tp_recv(socks[i], &m, fl_deadline_in(20)) == FL_OK) {
                if (m.hdr.type == FL_MSG_SHUTDOWN) {
                    ck_assert_int_eq(m.hdr.u.shutdown.code, 2);
                    ASSERT_HAS(m.hdr.u.shutdown.text, "shard 1");
                    ASSERT_HAS(m.hdr.u.shutdown.text, "ps-1");
                    ASSERT_HAS(m.hdr.u.shutdown.text, "--resume");
                    *got[i] = true;
                }
                fl_tp_msg_close(&m);
            }
        }
    }
    ck_assert(got0 && got1 && gota);
    ck_assert_int_eq(wait_finished(e.coord, 100), FL_EPEER);
    ASSERT_HAS(fl_last_error(), "declared dead");
    /* A rank registering again (for the coordinator that will replace this one) is not
     * answered: it keeps trying until the successor is up. */
    fl_tp_sock_t *again = fake_open(&e);
    send_worker(again, 0, 2, 100);
    int64_t quiet_until = fl_now_ms() + 500;
    while (fl_now_ms() < quiet_until) {
        if (fl_tp_recv(again, &m, fl_deadline_in(50)) == FL_OK) {
            bool beat = m.hdr.type == FL_MSG_HEARTBEAT;
            fl_tp_msg_close(&m);
            ck_assert_msg(beat, "a registration after the loss was answered");
        }
    }
    env_end(&e);
}
END_TEST

/* A parameter-server client that dies is named with what it was doing: the push or pull and
 * its step, not "not in a collective". */
START_TEST(test_dead_worker_names_its_push)
{
    env_t e;
    env_start(&e, 2, 1, 0, 800);
    fl_tp_sock_t *w0 = fake_open(&e), *w1 = fake_open(&e), *a = fake_open(&e);
    server_spec_t va = server_of(0, 1, 1);
    send_server(a, &va);
    send_worker(w0, 0, 2, 100);
    send_worker(w1, 1, 2, 100);
    fl_msg_hdr_t h;
    expect_welcome(w0, &h);
    fl_msg_hdr_deinit(&h);
    expect_welcome(w1, &h);
    fl_msg_hdr_deinit(&h);
    /* Rank 1's last word: in the push of step 1234; then silence. */
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, 1);
    snprintf(h.job_id, sizeof h.job_id, JOB);
    h.u.heartbeat.op = FL_MSG_OP_PUSH;
    h.u.heartbeat.op_seq = 1234;
    h.u.heartbeat.waiting_on = -1;
    ck_assert(fl_tp_send(w1, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    int64_t until = fl_now_ms() + 3000;
    bool told = false;
    fl_tp_msg_t m;
    while (fl_now_ms() < until && !told) {
        send_ctl(w0, FL_MSG_HEARTBEAT, 0, 0);
        send_ctl(a, FL_MSG_HEARTBEAT, FL_MSG_SENDER_SERVER, 0);
        while (!told && fl_tp_recv(w0, &m, fl_deadline_in(50)) == FL_OK) {
            if (m.hdr.type == FL_MSG_ERROR) {
                ASSERT_HAS(m.hdr.u.error.text, "rank 1");
                ASSERT_HAS(m.hdr.u.error.text, "declared dead");
                ASSERT_HAS(m.hdr.u.error.text, "in the push of step 1234");
                told = true;
            }
            fl_tp_msg_close(&m);
        }
    }
    ck_assert_msg(told, "rank 0 was not told of rank 1's death");
    ck_assert_int_eq(wait_finished(e.coord, 1000), FL_EPEER);
    env_end(&e);
}
END_TEST

START_TEST(test_server_leaving_early_ends_the_job)
{
    env_t e;
    env_start(&e, 1, 1, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *a = fake_open(&e);
    server_spec_t va = server_of(0, 1, 1);
    send_server(a, &va);
    send_worker(w, 0, 1, 16);
    fl_msg_hdr_t h;
    expect_welcome(w, &h);
    fl_msg_hdr_deinit(&h);
    send_ctl(a, FL_MSG_SHUTDOWN, FL_MSG_SENDER_SERVER, 1);
    fl_tp_msg_t m;
    fl_test_expect_msg(w, FL_MSG_SHUTDOWN, 3000, &m);
    ck_assert_int_eq(m.hdr.u.shutdown.code, 2);
    ASSERT_HAS(m.hdr.u.shutdown.text, "left before the job ended");
    fl_tp_msg_close(&m);
    ck_assert_int_eq(wait_finished(e.coord, 1000), FL_EPEER);
    env_end(&e);
}
END_TEST

/* A server that stops on its own error (a negative goodbye code: bad initial parameters, say)
 * would meet it again on a restart: every member hears an error and the job is over, instead
 * of members registering again for a restart that is not coming. */
START_TEST(test_server_own_error_ends_the_job)
{
    env_t e;
    env_start(&e, 1, 1, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *a = fake_open(&e);
    server_spec_t va = server_of(0, 1, 1);
    send_server(a, &va);
    send_worker(w, 0, 1, 16);
    fl_msg_hdr_t h;
    expect_welcome(w, &h);
    fl_msg_hdr_deinit(&h);
    send_ctl(a, FL_MSG_SHUTDOWN, FL_MSG_SENDER_SERVER, FL_EINVAL);
    fl_tp_msg_t m;
    fl_test_expect_msg(w, FL_MSG_ERROR, 3000, &m);
    ASSERT_HAS(m.hdr.u.error.text, "shard 0");
    ASSERT_HAS(m.hdr.u.error.text, "failed");
    fl_tp_msg_close(&m);
    ck_assert_int_eq(wait_finished(e.coord, 1000), FL_EPEER);
    env_end(&e);
}
END_TEST

START_TEST(test_server_leaving_in_rendezvous_frees_its_shards)
{
    env_t e;
    env_start(&e, 1, 1, 0, 0);
    fl_tp_sock_t *w = fake_open(&e), *a = fake_open(&e), *b = fake_open(&e);
    server_spec_t va = server_of(0, 1, 1);
    send_server(a, &va);
    send_ctl(a, FL_MSG_SHUTDOWN, FL_MSG_SENDER_SERVER, 0);
    usleep(200 * 1000);
    ck_assert_int_eq(fl_coord_servers_active(e.coord), 0);
    va.pid = 777; /* a restarted process takes the shard */
    send_server(b, &va);
    send_worker(w, 0, 1, 16);
    fl_msg_hdr_t h;
    expect_welcome(b, &h);
    ck_assert_uint_eq(h.u.welcome.nshards, 1);
    fl_msg_hdr_deinit(&h);
    env_end(&e);
}
END_TEST

START_TEST(test_options)
{
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = 1;
    fl_coord_t *c = NULL;
    o.num_shards = -1;
    ck_assert_int_eq(fl_coord_create(&o, &c), FL_EINVAL);
    o.num_shards = FL_MSG_MAX_SHARDS + 1;
    ck_assert_int_eq(fl_coord_create(&o, &c), FL_EINVAL);
    o.num_shards = 0;
    o.param_count = 10;
    ck_assert_int_eq(fl_coord_create(&o, &c), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "num_shards");
    ck_assert_ptr_null(c);
}
END_TEST

/* ---- the shard map ---- */

START_TEST(test_map_covers_everything_once)
{
    static const uint64_t sizes[] = {0,    1,    15,    16,     17,       31,       33,        100,
                                     1000, 4096, 65537, 203530, 16777216, 16777217, 1000000007};
    static const uint32_t shards[] = {1, 2, 3, 4, 7, 8, 16, 64, 4096};
    int bad = 0;
    char first_bad[256] = "";
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        for (size_t b = 0; b < sizeof shards / sizeof shards[0]; b++) {
            uint64_t n = sizes[a];
            uint32_t s = shards[b];
            uint64_t next = 0, lo = UINT64_MAX, hi = 0;
            for (uint32_t i = 0; i < s; i++) {
                fl_ps_range_t r;
                fl_ps_map_range(n, s, i, &r);
                bool ok = r.offset == next && (r.offset % FL_PS_ALIGN == 0 || r.offset == n);
                if (r.count > 0) {
                    lo = r.count < lo ? r.count : lo;
                    hi = r.count > hi ? r.count : hi;
                }
                if (i + 1 < s && r.count > 0 && r.count % FL_PS_ALIGN != 0)
                    ok = ok && r.offset + r.count == n; /* only the last piece is ragged */
                if (!ok && bad++ == 0)
                    snprintf(first_bad, sizeof first_bad, "n=%llu s=%u i=%u: [%llu, +%llu)",
                             (unsigned long long)n, s, i, (unsigned long long)r.offset,
                             (unsigned long long)r.count);
                next = r.offset + r.count;
            }
            if (next != n && bad++ == 0)
                snprintf(first_bad, sizeof first_bad, "n=%llu s=%u: covers %llu",
                         (unsigned long long)n, s, (unsigned long long)next);
            /* Balanced: at most one block apart (the ragged tail may be shorter still). */
            if (hi > 0 && hi - lo > FL_PS_ALIGN && bad++ == 0)
                snprintf(first_bad, sizeof first_bad, "n=%llu s=%u: sizes %llu..%llu",
                         (unsigned long long)n, s, (unsigned long long)lo, (unsigned long long)hi);
        }
    }
    ck_assert_msg(bad == 0, "%d bad maps, first: %s", bad, first_bad);
}
END_TEST

START_TEST(test_map_edges)
{
    fl_ps_range_t r;
    fl_ps_map_range(100, 4, 4, &r); /* index out of range */
    ck_assert_uint_eq(r.count, 0);
    fl_ps_map_range(100, 0, 0, &r);
    ck_assert_uint_eq(r.count, 0);
    /* Huge counts do not overflow. */
    uint64_t n = UINT64_MAX - 100;
    fl_ps_map_range(n, 4096, 4095, &r);
    ck_assert_uint_eq(r.offset + r.count, n);
    fl_ps_map_range(n, 4096, 2048, &r);
    ck_assert(r.offset > n / 2 - n / 4096 && r.offset < n / 2 + n / 4096);
    /* 20 parameters on 4 shards: two blocks, so two shards are empty. */
    uint64_t counts[4];
    for (uint32_t i = 0; i < 4; i++) {
        fl_ps_map_range(20, 4, i, &r);
        counts[i] = r.count;
    }
    ck_assert_uint_eq(counts[0] + counts[1] + counts[2] + counts[3], 20);
    ck_assert_int_eq((counts[0] == 0) + (counts[1] == 0) + (counts[2] == 0) + (counts[3] == 0), 2);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("coord_ps");
    TCase *t = tcase_create("rendezvous");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_shard_map_reaches_everyone);
    tcase_add_test(t, test_server_refusals);
    tcase_add_test(t, test_server_role_takeover);
    tcase_add_test(t, test_no_parameter_server);
    tcase_add_test(t, test_missing_shards_in_progress);
    tcase_add_test(t, test_unknown_param_count_fails_the_job);
    tcase_add_test(t, test_init_count_from_options);
    tcase_add_test(t, test_init_shapes_checked);
    tcase_add_test(t, test_too_many_shards_for_the_model);
    tcase_add_test(t, test_resume_picks_newest_common_step);
    tcase_add_test(t, test_resume_refusals);
    tcase_add_test(t, test_server_death_asks_for_restart);
    tcase_add_test(t, test_server_leaving_early_ends_the_job);
    tcase_add_test(t, test_dead_worker_names_its_push);
    tcase_add_test(t, test_server_own_error_ends_the_job);
    tcase_add_test(t, test_server_leaving_in_rendezvous_frees_its_shards);
    tcase_add_test(t, test_options);
    suite_add_tcase(s, t);
    t = tcase_create("map");
    tcase_add_test(t, test_map_covers_everything_once);
    tcase_add_test(t, test_map_edges);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
