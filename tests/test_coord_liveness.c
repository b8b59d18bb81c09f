/* The coordinator's liveness and the end of a job (ranks played by bare DEALER sockets): a
 * silent rank declared dead, every rank leaving cleanly, and a stop that says goodbye. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "coordutil.h"

/* A heartbeat reporting operation op #seq, waiting for rank `waiting` (-1: none). */
static void send_hb(fl_tp_sock_t *s, int sender, uint32_t op, uint64_t seq, int waiting)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, sender);
    snprintf(h.job_id, sizeof h.job_id, "%s", JOB);
    h.u.heartbeat.op = op;
    h.u.heartbeat.op_seq = seq;
    h.u.heartbeat.waiting_on = waiting;
    int rc = fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000));
    ck_assert_msg(rc == FL_OK, "heartbeat from %d: %s", sender, fl_last_error());
}

START_TEST(test_silent_rank_declared_dead)
{
    enum { WORLD = 3, DEAD = 2, TIMEOUT = 500 };
    env_t e;
    env_start(&e, WORLD, 0, TIMEOUT, 0);
    fl_tp_sock_t *s[WORLD];
    int64_t t0 = fl_now_ms(); /* the coordinator last hears DEAD after this */
    for (int r = 0; r < WORLD; r++) {
        s[r] = fake_open(&e);
        send_reg(s[r], r, WORLD);
    }
    for (int r = 0; r < WORLD; r++)
        expect_welcome(s[r], WORLD, NULL);
    ck_assert_int_eq(fl_coord_active(e.coord), WORLD);
    /* Its last word: in allreduce #7. The others then wait for it in #8. */
    send_hb(s[DEAD], DEAD, FL_MSG_OP_ALLREDUCE, 7, -1);
    usleep(50 * 1000);
    int64_t deadline = fl_deadline_in(TIMEOUT + 2000);
    bool got[WORLD] = {false};
    fl_msg_error_t err[WORLD];
    int ngot = 0;
    while (ngot < WORLD - 1 && fl_now_ms() < deadline) {
        for (int r = 0; r < WORLD; r++)
            if (r != DEAD && !got[r])
                send_hb(s[r], r, FL_MSG_OP_ALLREDUCE, 8, r == 0 ? DEAD : -1);
        int64_t slice = fl_deadline_in(50);
        for (int r = 0; r < WORLD; r++) {
            fl_tp_msg_t m;
            while (r != DEAD && !got[r] && fl_tp_recv(s[r], &m, slice) == FL_OK) {
                if (m.hdr.type == FL_MSG_ERROR) {
                    err[r] = m.hdr.u.error;
                    got[r] = true;
                    ngot++;
                }
                fl_tp_msg_close(&m);
            }
        }
    }
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(ngot == WORLD - 1, "%d of %d survivors told within %d ms", ngot, WORLD - 1,
                  TIMEOUT + 2000);
    ck_assert_msg(took >= TIMEOUT, "declared dead after %lld ms of a %d ms timeout",
                  (long long)took, TIMEOUT);
    for (int r = 0; r < WORLD; r++) {
        if (r == DEAD)
            continue;
        ck_assert_msg(err[r].code == FL_EPEER && err[r].about_rank == DEAD &&
                          strcmp(err[r].host, "host-2") == 0,
                      "rank %d got code %d about rank %d (%s)", r, err[r].code, err[r].about_rank,
                      err[r].host);
        ASSERT_HAS(err[r].text, "rank 2");
        ASSERT_HAS(err[r].text, "host-2");
        ASSERT_HAS(err[r].text, "pid 1002");
        ASSERT_HAS(err[r].text, "silent");
        /* The operation by name, and the newest collective the others wait for it in. */
        ASSERT_HAS(err[r].text, "in allreduce #7");
        ASSERT_HAS(err[r].text, "rank 0 waits for it in allreduce #8");
    }
    /* The dead rank is told too (should it only be frozen). */
    fl_tp_msg_t own;
    expect_msg(s[DEAD], FL_MSG_ERROR, 2000, &own);
    ck_assert_int_eq(own.hdr.u.error.about_rank, DEAD);
    ASSERT_HAS(own.hdr.u.error.text, "rank 2 declared dead by the coordinator at ");
    fl_tp_msg_close(&own);
    ck_assert_int_eq(fl_coord_wait(e.coord, 1000), FL_EPEER);
    ASSERT_HAS(fl_last_error(), "rank 2");
    ASSERT_HAS(fl_last_error(), "host-2");
    ASSERT_HAS(fl_last_error(), "silent");
    ck_assert_int_eq(fl_coord_active(e.coord), WORLD - 1);
    env_end(&e);
}
END_TEST

START_TEST(test_all_leave_cleanly)
{
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *s[3];
    for (int r = 0; r < 3; r++) {
        s[r] = fake_open(&e);
        send_reg(s[r], r, 3);
    }
    for (int r = 0; r < 3; r++)
        expect_welcome(s[r], 3, NULL);
    send_ctl(s[1], FL_MSG_SHUTDOWN, 1);
    send_ctl(s[0], FL_MSG_SHUTDOWN, 0);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_active, 1, 2000), 1);
    ck_assert_int_eq(fl_coord_wait(e.coord, 100), FL_ETIMEDOUT);
    ASSERT_HAS(fl_last_error(), "running");
    send_ctl(s[2], FL_MSG_SHUTDOWN, 2);
    ck_assert_int_eq(fl_coord_wait(e.coord, 3000), FL_OK);
    ck_assert_int_eq(fl_coord_active(e.coord), 0);
    ck_assert_int_eq(fl_coord_registered(e.coord), 3);
    env_end(&e);
}
END_TEST

START_TEST(test_stop_says_goodbye)
{
    /* During the rendezvous: both registered ranks are told. */
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *b = fake_open(&e);
    send_reg(a, 0, 3);
    send_reg(b, 1, 3);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 2, 2000), 2);
    fl_coord_stop(e.coord);
    fl_tp_sock_t *both[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        fl_tp_msg_t m;
        expect_msg(both[i], FL_MSG_SHUTDOWN, 2000, &m);
        int code = m.hdr.u.shutdown.code;
        char text[FL_MSG_TEXT_MAX];
        snprintf(text, sizeof text, "%s", m.hdr.u.shutdown.text);
        fl_tp_msg_close(&m);
        ck_assert_msg(code != 0, "goodbye %d has code 0 (clean)", i);
        ASSERT_HAS(text, "stopped");
    }
    env_end(&e);

    /* While running: only the rank still there is told. */
    env_start(&e, 2, 0, 0, 0);
    a = fake_open(&e);
    b = fake_open(&e);
    send_reg(a, 0, 2);
    send_reg(b, 1, 2);
    expect_welcome(a, 2, NULL);
    expect_welcome(b, 2, NULL);
    send_ctl(a, FL_MSG_SHUTDOWN, 0);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_active, 1, 2000), 1);
    fl_coord_stop(e.coord);
    fl_tp_msg_t m;
    expect_msg(b, FL_MSG_SHUTDOWN, 2000, &m);
    fl_tp_msg_close(&m);
    expect_quiet(a, 200);
    env_end(&e);
}
END_TEST

Suite *coord_liveness_suite(void);
Suite *coord_liveness_suite(void)
{
    Suite *s = suite_create("coord_liveness");
    TCase *t = tcase_create("liveness");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_silent_rank_declared_dead);
    tcase_add_test(t, test_all_leave_cleanly);
    tcase_add_test(t, test_stop_says_goodbye);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(coord_liveness_suite());
}
