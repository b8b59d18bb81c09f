/* Real communicators against the coordinator: refused for the wrong job or world size, finding
 * no coordinator (tcp and ipc) within the rendezvous deadline, missing a rank, and a job that
 * ends cleanly. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "coordutil.h"

typedef struct comm_try {
    fl_comm_opts_t opts;
    int rc;
    int64_t ms;
    char err[1024];
} comm_try_t;

static void *comm_try_main(void *p)
{
    comm_try_t *t = p;
    fl_comm_t *comm = NULL;
    int64_t t0 = fl_now_ms();
    t->rc = fl_comm_init(&t->opts, &comm);
    t->ms = fl_now_ms() - t0;
    snprintf(t->err, sizeof t->err, "%s", t->rc == FL_OK ? "" : fl_last_error());
    fl_comm_destroy(&comm);
    return NULL;
}

START_TEST(test_comm_wrong_job)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    comm_try_t t;
    fl_test_comm_opts(&t.opts, e.coord, 0, 2);
    t.opts.job_id = "other-job";
    comm_try_main(&t);
    ck_assert_msg(t.rc == FL_EINVAL, "rc %d: %s", t.rc, t.err);
    ASSERT_HAS(t.err, "refused");
    ASSERT_HAS(t.err, "'other-job'");
    ASSERT_HAS(t.err, "'" JOB "'");
    ck_assert_msg(t.ms < 5000, "refusal took %lld ms", (long long)t.ms);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    env_end(&e);
}
END_TEST

START_TEST(test_comm_world_mismatch)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    comm_try_t t;
    fl_test_comm_opts(&t.opts, e.coord, 2, 3);
    t.opts.job_id = JOB;
    comm_try_main(&t);
    ck_assert_msg(t.rc == FL_EINVAL, "rc %d: %s", t.rc, t.err);
    ASSERT_HAS(t.err, "refused");
    ASSERT_HAS(t.err, "world size 3");
    ASSERT_HAS(t.err, "expects 2");
    env_end(&e);
}
END_TEST

START_TEST(test_comm_no_coordinator)
{
    enum { RDV = 800 };
    /* A port that was bound a moment ago and is closed now, and an ipc path nobody binds. */
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    fl_ctx_t *ctx = NULL;
    ck_assert_int_eq(fl_ctx_create(&co, &ctx), FL_OK);
    fl_tp_opts_t to;
    fl_tp_opts_init(&to);
    fl_tp_sock_t *s = NULL;
    char tcp[FL_ENDPOINT_MAX];
    ck_assert_int_eq(fl_tp_sock_create(ctx, FL_TP_ROUTER, &to, "gone", &s), FL_OK);
    ck_assert_int_eq(fl_tp_sock_bind(s, "tcp://127.0.0.1:0", tcp, sizeof tcp), FL_OK);
    fl_tp_sock_destroy(&s);
    fl_ctx_destroy(&ctx);
    char ipc[128];
    snprintf(ipc, sizeof ipc, "ipc:///tmp/flodl-test-coord-%d-nobody", (int)getpid());
    const char *eps[2] = {tcp, ipc};
    comm_try_t t[2];
    for (int i = 0; i < 2; i++) {
        fl_comm_opts_init(&t[i].opts);
        t[i].opts.rank = 0;
        t[i].opts.world_size = 2;
        t[i].opts.coordinator = eps[i];
        t[i].opts.host = "127.0.0.1";
        t[i].opts.rendezvous_timeout_ms = RDV;
        t[i].opts.log_level = FL_LOG_OFF;
        comm_try_main(&t[i]);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(t[i].rc == FL_ETIMEDOUT, "%s: rc %d: %s", eps[i], t[i].rc, t[i].err);
        ASSERT_HAS(t[i].err, "no answer");
        ASSERT_HAS(t[i].err, eps[i]);
    }
    /* The deadline is the rendezvous timeout: giving up must not wait for the unsent
     * registration to linger on top of it. */
    for (int i = 0; i < 2; i++)
        ck_assert_msg(t[i].ms >= RDV - 50 && t[i].ms <= RDV + 500,
                      "%s: fl_comm_init gave up after %lld ms with a %d ms rendezvous timeout "
                      "(tcp: %lld ms, ipc: %lld ms)",
                      eps[i], (long long)t[i].ms, RDV, (long long)t[0].ms, (long long)t[1].ms);
}
END_TEST

START_TEST(test_comm_missing_rank)
{
    env_t e;
    env_start(&e, 3, 100, 3000, 0);
    comm_try_t t[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        fl_test_comm_opts(&t[r].opts, e.coord, r, 3);
        t[r].opts.job_id = JOB;
        t[r].opts.rendezvous_timeout_ms = 1500;
        t[r].opts.log_level = FL_LOG_OFF;
        ck_assert_int_eq(pthread_create(&th[r], NULL, comm_try_main, &t[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(t[r].rc == FL_ETIMEDOUT, "rank %d: rc %d: %s", r, t[r].rc, t[r].err);
        ASSERT_HAS(t[r].err, "2 of 3");
        ASSERT_HAS(t[r].err, "missing 2");
    }
    env_end(&e);
}
END_TEST

static int barrier_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    return fl_barrier(comm);
}

START_TEST(test_comm_job_ends_cleanly)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_comm_opts_t o;
    fl_test_comm_opts(&o, e.coord, 0, 2);
    o.job_id = JOB;
    char err[1024] = "";
    int rc = fl_test_run_ranks(2, &o, barrier_rank, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s", err);
    ck_assert_int_eq(fl_coord_wait(e.coord, 5000), FL_OK);
    ck_assert_int_eq(fl_coord_active(e.coord), 0);
    env_end(&e);
}
END_TEST

Suite *coord_comm_suite(void);
Suite *coord_comm_suite(void)
{
    Suite *s = suite_create("coord_comm");
    TCase *t = tcase_create("comm");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_comm_wrong_job);
    tcase_add_test(t, test_comm_world_mismatch);
    tcase_add_test(t, test_comm_no_coordinator);
    tcase_add_test(t, test_comm_missing_rank);
    tcase_add_test(t, test_comm_job_ends_cleanly);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(coord_comm_suite());
}
