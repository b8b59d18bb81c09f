/* Helpers shared by the coordinator suites: the coordinator, fake ranks and their messages. */
#include "coordutil.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void env_start_log(env_t *e, int world, int hb_ms, int hb_timeout_ms, int rdv_ms,
                   fl_log_level_t level)
{
    memset(e, 0, sizeof *e);
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = world;
    o.job_id = JOB;
    o.heartbeat_ms = hb_ms;
    o.heartbeat_timeout_ms = hb_timeout_ms > 0 ? hb_timeout_ms : 3000;
    o.rendezvous_timeout_ms = rdv_ms > 0 ? rdv_ms : 30000;
    o.log_level = level;
    int rc = fl_coord_create(&o, &e->coord);
    ck_assert_msg(rc == FL_OK, "coordinator: %s", fl_last_error());
    rc = fl_coord_start(e->coord);
    ck_assert_msg(rc == FL_OK, "coordinator start: %s", fl_last_error());
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    co.log_name = "fake rank";
    rc = fl_ctx_create(&co, &e->ctx);
    ck_assert_msg(rc == FL_OK, "context: %s", fl_last_error());
}

void env_start(env_t *e, int world, int hb_ms, int hb_timeout_ms, int rdv_ms)
{
    env_start_log(e, world, hb_ms, hb_timeout_ms, rdv_ms, FL_LOG_OFF);
}

void env_end(env_t *e)
{
    for (int i = 0; i < e->nfakes; i++)
        fl_tp_sock_destroy(&e->fakes[i]);
    fl_ctx_destroy(&e->ctx);
    fl_coord_stop(e->coord);
    fl_coord_destroy(&e->coord);
}

fl_tp_sock_t *fake_open(env_t *e)
{
    ck_assert(e->nfakes < MAX_FAKES);
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *s = NULL;
    int rc = fl_tp_sock_create(e->ctx, FL_TP_DEALER, &t, "fake", &s);
    ck_assert_msg(rc == FL_OK, "fake socket: %s", fl_last_error());
    rc = fl_tp_sock_connect(s, fl_coord_endpoint(e->coord));
    ck_assert_msg(rc == FL_OK, "fake connect: %s", fl_last_error());
    e->fakes[e->nfakes++] = s;
    return s;
}

#define SETTINGS "optimizer=sgd;lr=0.05;batch-size=64 per device"

reg_spec_t spec_of(int rank, int world)
{
    reg_spec_t r = {rank, world, JOB, NULL, 1000 + rank, TUNING, 1 + (rank & 1), SETTINGS, NULL};
    return r;
}

void endpoint_of(int rank, int k, char *out, size_t cap)
{
    snprintf(out, cap, "tcp://10.0.0.%d:%d", (rank & 127) + 1, 20000 + rank * 10 + k);
}

void build_register(fl_msg_hdr_t *h, const reg_spec_t *r)
{
    fl_msg_hdr_init(h, FL_MSG_REGISTER, r->rank);
    snprintf(h->job_id, sizeof h->job_id, "%s", r->job);
    h->u.reg.rank = r->rank;
    h->u.reg.world_size = r->world;
    if (r->host != NULL)
        snprintf(h->u.reg.host, sizeof h->u.reg.host, "%s", r->host);
    else
        snprintf(h->u.reg.host, sizeof h->u.reg.host, "host-%d", r->rank);
    h->u.reg.pid = r->pid;
    snprintf(h->u.reg.tuning, sizeof h->u.reg.tuning, "%s", r->tuning);
    snprintf(h->u.reg.settings, sizeof h->u.reg.settings, "%s", r->settings);
    h->u.reg.nendpoints = (uint32_t)r->nendpoints;
    for (int k = 0; k < r->nendpoints; k++)
        endpoint_of(r->rank, k, h->u.reg.endpoints[k], sizeof h->u.reg.endpoints[k]);
    if (r->token != NULL)
        snprintf(h->u.reg.token, sizeof h->u.reg.token, "%s", r->token);
}

void send_spec(fl_tp_sock_t *s, const reg_spec_t *r)
{
    fl_msg_hdr_t h;
    build_register(&h, r);
    int rc = fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000));
    ck_assert_msg(rc == FL_OK, "register rank %d: %s", r->rank, fl_last_error());
}

void send_reg(fl_tp_sock_t *s, int rank, int world)
{
    reg_spec_t r = spec_of(rank, world);
    send_spec(s, &r);
}

void send_ctl(fl_tp_sock_t *s, fl_msg_type_t type, int sender)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, type, sender);
    snprintf(h.job_id, sizeof h.job_id, "%s", JOB);
    if (type == FL_MSG_SHUTDOWN)
        snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text, "rank %d leaves", sender);
    int rc = fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000));
    ck_assert_msg(rc == FL_OK, "%s from %d: %s", fl_msg_type_name(type), sender, fl_last_error());
}

#define describe fl_test_describe_msg

void expect_error(fl_tp_sock_t *s, int code, int timeout_ms, fl_msg_error_t *out)
{
    fl_tp_msg_t m;
    expect_msg(s, FL_MSG_ERROR, timeout_ms, &m);
    *out = m.hdr.u.error;
    fl_tp_msg_close(&m);
    ck_assert_msg(out->code == code, "error code %d, expected %d (%s): %s", out->code, code,
                  fl_strerror(code), out->text);
}

void expect_quiet(fl_tp_sock_t *s, int ms)
{
    int64_t deadline = fl_deadline_in(ms);
    for (;;) {
        fl_tp_msg_t m;
        int rc = fl_tp_recv(s, &m, deadline);
        if (rc == FL_ETIMEDOUT)
            return;
        if (rc != FL_OK)
            continue;
        char got[FL_MSG_TEXT_MAX + 64];
        describe(&m, got, sizeof got);
        bool beat = m.hdr.type == FL_MSG_HEARTBEAT;
        fl_tp_msg_close(&m);
        if (!beat)
            ck_abort_msg("expected no answer, got %s", got);
    }
}

void expect_welcome(fl_tp_sock_t *s, int world, uint64_t *generation)
{
    fl_tp_msg_t m;
    expect_msg(s, FL_MSG_WELCOME, 2000, &m);
    uint32_t n = m.hdr.u.welcome.npeers;
    if (generation != NULL)
        *generation = m.hdr.generation;
    fl_tp_msg_close(&m);
    ck_assert_int_eq(n, world);
}

void expect_welcome_token(fl_tp_sock_t *s, int world, char token[FL_MSG_TOKEN_MAX])
{
    fl_tp_msg_t m;
    expect_msg(s, FL_MSG_WELCOME, 2000, &m);
    uint32_t n = m.hdr.u.welcome.npeers;
    snprintf(token, FL_MSG_TOKEN_MAX, "%s", m.hdr.u.welcome.token);
    fl_tp_msg_close(&m);
    ck_assert_int_eq(n, world);
}

int wait_count(const fl_coord_t *c, int (*fn)(const fl_coord_t *), int want, int timeout_ms)
{
    int64_t deadline = fl_deadline_in(timeout_ms);
    int v = fn(c);
    while (v != want && fl_now_ms() < deadline) {
        usleep(2000);
        v = fn(c);
    }
    return v;
}

uint64_t wait_stat(const fl_coord_t *c, fl_stat_t st, uint64_t want, int timeout_ms)
{
    int64_t deadline = fl_deadline_in(timeout_ms);
    uint64_t v = fl_coord_stat(c, st);
    while (v < want && fl_now_ms() < deadline) {
        usleep(2000);
        v = fl_coord_stat(c, st);
    }
    return v;
}
