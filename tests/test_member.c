/* transport/tp_member.c: joining a coordinator, the events of the control thread (a dead peer,
 * a coordinator that goes away), and reconnecting to a restarted coordinator on the same
 * endpoint within the reconnect deadline, or failing with a clear error after it. */
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_ps.h"
#include "fl_tp.h"
#include "testutil.h"

static fl_coord_t *coord_at(const char *bind, int world, int hb_timeout_ms)
{
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = bind;
    o.world_size = world;
    o.heartbeat_timeout_ms = hb_timeout_ms;
    o.rendezvous_timeout_ms = 20000;
    o.log_level = FL_LOG_OFF;
    fl_coord_t *c = NULL;
    ck_assert_msg(fl_coord_create(&o, &c) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(fl_coord_start(c) == FL_OK, "%s", fl_last_error());
    return c;
}

static fl_ctx_t *quiet_ctx(void)
{
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert(fl_ctx_create(&co, &ctx) == FL_OK);
    return ctx;
}

static void worker_reg(fl_msg_register_t *r, int rank, int world)
{
    memset(r, 0, sizeof *r);
    r->rank = rank;
    r->world_size = world;
    snprintf(r->host, sizeof r->host, "127.0.0.1");
    r->nendpoints = 1;
    snprintf(r->endpoints[0], sizeof r->endpoints[0], "tcp://127.0.0.1:%d", 1 + rank);
    r->pid = getpid();
}

static fl_tp_member_t *member(fl_ctx_t *ctx, const char *coordinator, int rank, int reconnect_ms)
{
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = coordinator;
    mo.name = rank == 0 ? "rank 0" : "rank 1";
    mo.sender = rank;
    mo.rendezvous_timeout_ms = 10000;
    mo.reconnect_timeout_ms = reconnect_ms;
    fl_tp_member_t *m = NULL;
    ck_assert_msg(fl_tp_member_create(ctx, &mo, &m) == FL_OK, "%s", fl_last_error());
    return m;
}

/* Waits up to ms for the next event. */
static int next_event(fl_tp_member_t *m, int ms, fl_tp_msg_t *ev)
{
    return fl_tp_recv(fl_tp_member_events(m), ev, fl_deadline_in(ms));
}

START_TEST(test_join_and_clean_leave)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 2000);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert_msg(fl_tp_member_join(m, &r, &w) == FL_OK, "%s", fl_last_error());
    ck_assert_int_eq(w.type, FL_MSG_WELCOME);
    ck_assert_uint_eq(w.u.welcome.npeers, 1);
    ck_assert_uint_eq(fl_tp_member_generation(m), w.generation);
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    /* The status reaches the heartbeats without a call. */
    atomic_store(&fl_tp_member_status(m)->op, 3);
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 300, &ev), FL_ETIMEDOUT); /* nothing to report */
    fl_tp_member_stop(m, 0, "done");
    ck_assert_int_eq(fl_coord_wait(c, 5000), FL_OK); /* the coordinator saw a clean leave */
    fl_tp_member_destroy(&m);
    ck_assert_ptr_null(m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_refused_join_names_both)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 2, 2000);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_msg_register_t r;
    worker_reg(&r, 0, 3); /* the coordinator expects 2 */
    fl_msg_hdr_t w;
    ck_assert_int_eq(fl_tp_member_join(m, &r, &w), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "world size 3") != NULL &&
                      strstr(fl_last_error(), "expects 2") != NULL,
                  "%s", fl_last_error());
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_no_coordinator_times_out)
{
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = "tcp://127.0.0.1:1"; /* nobody listens there */
    mo.name = "rank 0";
    mo.rendezvous_timeout_ms = 500;
    fl_tp_member_t *m = NULL;
    ck_assert(fl_tp_member_create(ctx, &mo, &m) == FL_OK);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    int64_t t0 = fl_now_ms();
    ck_assert_int_eq(fl_tp_member_join(m, &r, &w), FL_ETIMEDOUT);
    ck_assert_int_lt(fl_now_ms() - t0, 3000);
    ck_assert_msg(strstr(fl_last_error(), "no answer from the coordinator") != NULL, "%s",
                  fl_last_error());
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_bad_options)
{
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    fl_tp_member_t *m = NULL;
    ck_assert_int_eq(fl_tp_member_create(ctx, &mo, &m), FL_EINVAL); /* no coordinator */
    mo.coordinator = "udp://x:1";
    ck_assert_int_eq(fl_tp_member_create(ctx, &mo, &m), FL_EINVAL);
    mo.coordinator = "tcp://127.0.0.1:5";
    mo.reconnect_timeout_ms = -1;
    ck_assert_int_eq(fl_tp_member_create(ctx, &mo, &m), FL_EINVAL);
    ck_assert_ptr_null(m);
    mo.reconnect_timeout_ms = 0;
    ck_assert(fl_tp_member_create(ctx, &mo, &m) == FL_OK);
    ck_assert_int_eq(fl_tp_member_start(m), FL_EINVAL); /* before a join */
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* A member that does not reconnect: the death of another rank, then a coordinator that
 * stops, are fatal events naming what happened. */
START_TEST(test_peer_death_is_an_error_event)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 2, 600);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *a = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_tp_member_t *b = member(ctx, fl_coord_endpoint(c), 1, 0);
    fl_msg_register_t ra, rb;
    worker_reg(&ra, 0, 2);
    worker_reg(&rb, 1, 2);
    /* b registers without waiting for the welcome (its join would block): a raw register. */
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *raw = NULL;
    ck_assert(fl_tp_sock_create(ctx, FL_TP_DEALER, &t, "raw", &raw) == FL_OK);
    ck_assert(fl_tp_sock_connect(raw, fl_coord_endpoint(c)) == FL_OK);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, 1);
    snprintf(h.job_id, sizeof h.job_id, "flodl");
    h.u.reg = rb;
    ck_assert(fl_tp_send(raw, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    fl_msg_hdr_t w;
    ck_assert_msg(fl_tp_member_join(a, &ra, &w) == FL_OK, "%s", fl_last_error());
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(a) == FL_OK);
    /* rank 1 never heartbeats: declared dead within the coordinator's timeout. */
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(a, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_ERROR);
    ck_assert_int_eq(ev.hdr.u.error.code, FL_EPEER);
    ck_assert_int_eq(ev.hdr.u.error.about_rank, 1);
    ck_assert_msg(strstr(ev.hdr.u.error.text, "rank 1") != NULL, "%s", ev.hdr.u.error.text);
    fl_tp_msg_close(&ev);
    fl_tp_member_destroy(&a);
    fl_tp_member_destroy(&b);
    fl_tp_sock_destroy(&raw);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_coordinator_gone_without_reconnect)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 2000);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert(fl_tp_member_join(m, &r, &w) == FL_OK);
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    fl_coord_stop(c); /* says goodbye with a non-zero code */
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_ERROR);
    ck_assert_msg(strstr(ev.hdr.u.error.text, "coordinator ended the job") != NULL, "%s",
                  ev.hdr.u.error.text);
    fl_tp_msg_close(&ev);
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

/* The coordinator stops and a new one comes up on the same endpoint: the member says it lost
 * the coordinator, registers again, and posts the new welcome (another generation). */
START_TEST(test_reconnect_to_restarted_coordinator)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 1000);
    char ep[FL_ENDPOINT_MAX];
    snprintf(ep, sizeof ep, "%s", fl_coord_endpoint(c));
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, ep, 0, 10000);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert(fl_tp_member_join(m, &r, &w) == FL_OK);
    uint64_t gen1 = w.generation;
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);

    fl_coord_destroy(&c);
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_SHUTDOWN);
    ck_assert_int_eq(ev.hdr.u.shutdown.code, FL_TP_MEMBER_LOST);
    ck_assert_msg(strstr(ev.hdr.u.shutdown.text, "registering again") != NULL, "%s",
                  ev.hdr.u.shutdown.text);
    fl_tp_msg_close(&ev);

    usleep(300 * 1000);
    c = coord_at(ep, 1, 1000); /* same port */
    ck_assert_int_eq(next_event(m, 8000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_WELCOME);
    ck_assert_uint_ne(ev.hdr.generation, gen1);
    ck_assert_uint_eq(ev.hdr.u.welcome.npeers, 1);
    ck_assert_uint_eq(fl_tp_member_generation(m), ev.hdr.generation);
    fl_tp_msg_close(&ev);

    /* Alive and beating with the new coordinator: no event for a while (well past its
     * heartbeat timeout), then a clean leave the new coordinator counts. */
    ck_assert_int_eq(next_event(m, 1500, &ev), FL_ETIMEDOUT);
    fl_tp_member_stop(m, 0, "done");
    ck_assert_int_eq(fl_coord_wait(c, 5000), FL_OK);
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_reconnect_gives_up_at_its_deadline)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 600);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 800);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert(fl_tp_member_join(m, &r, &w) == FL_OK);
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    fl_coord_destroy(&c);
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.u.shutdown.code, FL_TP_MEMBER_LOST);
    fl_tp_msg_close(&ev);
    int64_t t0 = fl_now_ms();
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_lt(fl_now_ms() - t0, 3000);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_ERROR);
    ck_assert_int_eq(ev.hdr.u.error.code, FL_EPEER);
    ck_assert_msg(strstr(ev.hdr.u.error.text, "not back") != NULL, "%s", ev.hdr.u.error.text);
    fl_tp_msg_close(&ev);
    /* Stop is prompt after a failure. */
    t0 = fl_now_ms();
    fl_tp_member_destroy(&m);
    ck_assert_int_lt(fl_now_ms() - t0, 3000);
    fl_ctx_destroy(&ctx);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("member");
    TCase *t = tcase_create("member");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_join_and_clean_leave);
    tcase_add_test(t, test_refused_join_names_both);
    tcase_add_test(t, test_no_coordinator_times_out);
    tcase_add_test(t, test_bad_options);
    tcase_add_test(t, test_peer_death_is_an_error_event);
    tcase_add_test(t, test_coordinator_gone_without_reconnect);
    tcase_add_test(t, test_reconnect_to_restarted_coordinator);
    tcase_add_test(t, test_reconnect_gives_up_at_its_deadline);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
