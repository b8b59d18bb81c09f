/* The coordinator's rendezvous (server/coord*.c in-process on 127.0.0.1, ranks played by bare
 * DEALER sockets): registration and the peer table, every refusal (duplicate, range, world size,
 * job, tuning, late), ranks that disagree on what they share, and drops and timeouts of the
 * rendezvous. Taking over a rank is test_coord_identity.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "coordutil.h"

#define ASSERT_HASNT(text, needle)                                                                 \
    ck_assert_msg(strstr((text), (needle)) == NULL, "\"%s\" reveals \"%s\"", (text), (needle))

/* First mismatch between a welcome's peer table and what spec_of() registered, or "". */
static void check_peers(const fl_msg_welcome_t *w, int world, char *out, size_t cap)
{
    out[0] = '\0';
    if (w->npeers != (uint32_t)world) {
        snprintf(out, cap, "%u peers for world %d", w->npeers, world);
        return;
    }
    for (int i = 0; i < world; i++) {
        const fl_msg_peer_t *p = &w->peers[i];
        reg_spec_t want = spec_of(i, world);
        char host[32];
        snprintf(host, sizeof host, "host-%d", i);
        if (p->rank != i || strcmp(p->host, host) != 0 || p->pid != want.pid ||
            p->nendpoints != (uint32_t)want.nendpoints) {
            snprintf(out, cap, "entry %d: rank %d host %.64s pid %d with %u endpoints", i, p->rank,
                     p->host, p->pid, p->nendpoints);
            return;
        }
        for (int k = 0; k < want.nendpoints; k++) {
            char ep[64];
            endpoint_of(i, k, ep, sizeof ep);
            if (strcmp(p->endpoints[k], ep) != 0) {
                snprintf(out, cap, "entry %d endpoint %d: %.64s, expected %.64s", i, k,
                         p->endpoints[k], ep);
                return;
            }
        }
    }
}

START_TEST(test_welcome_peer_table)
{
    env_t e;
    env_start(&e, 4, 150, 3000, 0);
    static const int order[4] = {3, 1, 0, 2};
    fl_tp_sock_t *s[4];
    for (int i = 0; i < 4; i++) {
        s[order[i]] = fake_open(&e);
        send_reg(s[order[i]], order[i], 4);
        ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, i + 1, 2000), i + 1);
        if (i == 2)
            expect_quiet(s[3], 100); /* no welcome while a rank is missing */
    }
    uint64_t gen0 = 0;
    for (int r = 0; r < 4; r++) {
        fl_tp_msg_t m;
        expect_msg(s[r], FL_MSG_WELCOME, 2000, &m);
        char bad[256];
        check_peers(&m.hdr.u.welcome, 4, bad, sizeof bad);
        uint32_t hb = m.hdr.u.welcome.heartbeat_ms;
        uint32_t hbt = m.hdr.u.welcome.heartbeat_timeout_ms;
        uint64_t gen = m.hdr.generation;
        char job[FL_JOB_MAX];
        snprintf(job, sizeof job, "%s", m.hdr.job_id);
        fl_tp_msg_close(&m);
        ck_assert_msg(bad[0] == '\0', "rank %d's peer table: %s", r, bad);
        ck_assert_msg(hb == 150 && hbt == 3000, "rank %d: heartbeat %u / %u ms", r, hb, hbt);
        ck_assert_msg(gen != 0 && (r == 0 || gen == gen0), "rank %d: generation %llu vs %llu", r,
                      (unsigned long long)gen, (unsigned long long)gen0);
        ck_assert_str_eq(job, JOB);
        gen0 = gen;
    }
    ck_assert_int_eq(fl_coord_registered(e.coord), 4);
    ck_assert_int_eq(fl_coord_active(e.coord), 4);
    ck_assert_int_eq(fl_coord_wait(e.coord, 50), FL_ETIMEDOUT);
    env_end(&e);
}
END_TEST

START_TEST(test_duplicate_rank)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *c = fake_open(&e);
    reg_spec_t ra = spec_of(0, 2);
    ra.host = "host-a";
    ra.pid = 1111;
    send_spec(a, &ra);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    reg_spec_t rb = ra;
    rb.host = "host-b";
    rb.pid = 2222;
    send_spec(b, &rb);
    fl_msg_error_t err;
    expect_error(b, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 0");
    ASSERT_HASNT(err.text, "host-a"); /* nothing a stranger could use to claim the rank */
    ASSERT_HASNT(err.text, "1111");
    ASSERT_HAS(err.text, "host-b");
    ASSERT_HAS(err.text, "2222");
    ck_assert_int_eq(err.about_rank, 0);
    ck_assert_int_eq(fl_coord_registered(e.coord), 1);

    send_reg(c, 1, 2);
    fl_tp_msg_t m;
    expect_msg(a, FL_MSG_WELCOME, 2000, &m);
    char host0[FL_HOST_MAX];
    snprintf(host0, sizeof host0, "%s", m.hdr.u.welcome.peers[0].host);
    int pid0 = m.hdr.u.welcome.peers[0].pid;
    fl_tp_msg_close(&m);
    ck_assert_str_eq(host0, "host-a");
    ck_assert_int_eq(pid0, 1111);
    expect_welcome(c, 2, NULL);
    expect_quiet(b, 200);
    env_end(&e);
}
END_TEST

START_TEST(test_refusals_keep_serving)
{
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *x = fake_open(&e);
    send_reg(a, 0, 3);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    fl_msg_error_t err;

    reg_spec_t r = spec_of(7, 3);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 7");
    ASSERT_HAS(err.text, "0..2");
    ASSERT_HAS(err.text, "world size 3");
    ck_assert_int_eq(err.about_rank, 7);

    r = spec_of(-1, 3);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank -1");

    r = spec_of(1, 5);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "world size 5");
    ASSERT_HAS(err.text, "expects 3");

    r = spec_of(1, 3);
    r.job = "other-job";
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "'other-job'");
    ASSERT_HAS(err.text, "'" JOB "'");
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_BAD_JOB, 1, 1000), 1); /* counted, not lost */

    r = spec_of(1, 3);
    r.nendpoints = 0;
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "endpoint");

    ck_assert_int_eq(fl_coord_registered(e.coord), 1);
    /* The coordinator counts an error once sent, so the reply may arrive first. */
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_ERRORS_SENT, 5, 1000), 5);

    /* The refused socket may still register a valid rank, and the job starts. */
    fl_tp_sock_t *c = fake_open(&e);
    send_reg(x, 1, 3);
    send_reg(c, 2, 3);
    expect_welcome(a, 3, NULL);
    expect_welcome(x, 3, NULL);
    expect_welcome(c, 3, NULL);

    /* After the start: a newcomer for a taken rank, and one out of range. */
    fl_tp_sock_t *d = fake_open(&e);
    r = spec_of(1, 3);
    r.host = "late-host";
    r.pid = 4242;
    send_spec(d, &r);
    expect_error(d, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 1");
    ASSERT_HASNT(err.text, "host-1");
    ASSERT_HAS(err.text, "late-host");
    ASSERT_HAS(err.text, "4242");
    r = spec_of(3, 3);
    send_spec(d, &r);
    expect_error(d, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 3");
    ASSERT_HAS(err.text, "0..2");

    /* A rank that lost its welcome asks again and is answered again. */
    send_reg(a, 0, 3);
    expect_welcome(a, 3, NULL);
    ck_assert_int_eq(fl_coord_registered(e.coord), 3);
    ck_assert_int_eq(fl_coord_active(e.coord), 3);
    ck_assert_int_eq(fl_coord_wait(e.coord, 50), FL_ETIMEDOUT);
    env_end(&e);
}
END_TEST

/* Ranks that disagree on what they must share (a declared setting, the collective settings,
 * the model) end the rendezvous at once: the newcomer and every registered rank hear the
 * setting and both values, and the job fails instead of waiting for a rank to be fixed. */
static void disagree_case(const char *what, reg_spec_t bad, const char *const *want)
{
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *x = fake_open(&e);
    send_reg(a, 0, 3);
    send_reg(b, 2, 3);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 2, 2000), 2);
    int64_t t0 = fl_now_ms();
    send_spec(x, &bad);
    fl_msg_error_t err[3];
    expect_error(x, FL_EINVAL, 1000, &err[0]);
    expect_error(a, FL_EINVAL, 1000, &err[1]);
    expect_error(b, FL_EINVAL, 1000, &err[2]);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; want[k] != NULL; k++)
            ck_assert_msg(strstr(err[i].text, want[k]) != NULL, "%s: '%s' lacks '%s'", what,
                          err[i].text, want[k]);
        ck_assert_int_eq(err[i].about_rank, 1);
    }
    ck_assert_int_eq(fl_coord_wait(e.coord, 1000), FL_EINVAL);
    ck_assert_msg(fl_now_ms() - t0 < 1000, "%s: refused after %lld ms", what,
                  (long long)(fl_now_ms() - t0));
    ASSERT_HAS(fl_last_error(), "cannot start");
    char outcome[2048];
    fl_coord_outcome(e.coord, outcome, sizeof outcome);
    ASSERT_HAS(outcome, "rank 1 refused");
    ASSERT_HAS(outcome, "rank 0 registered; the job did not start");
    /* Too late for anyone now: the job failed. */
    fl_tp_sock_t *y = fake_open(&e);
    send_reg(y, 1, 3);
    fl_msg_error_t late;
    expect_error(y, FL_EINVAL, 1000, &late);
    ASSERT_HAS(late.text, "failed");
    env_end(&e);
}

START_TEST(test_disagreement_fails_rendezvous)
{
    reg_spec_t r = spec_of(1, 3);
    r.settings = "optimizer=sgd;lr=0.1;batch-size=64 per device";
    static const char *const lr[] = {"disagree on lr", "'0.1' on rank 1", "'0.05' on rank 0",
                                     "host-1",         "host-0",          NULL};
    disagree_case("lr", r, lr);

    r = spec_of(1, 3);
    r.settings = "optimizer=sgd;lr=0.05";
    static const char *const missing[] = {"disagree on batch-size", "'(not set)' on rank 1",
                                          "'64 per device' on rank 0", NULL};
    disagree_case("missing setting", r, missing);

    r = spec_of(1, 3);
    r.tuning = "seg=4096,small=0,algo=1";
    static const char *const tuning[] = {"'seg=4096,small=0,algo=1'", "'" TUNING "'", "host-0",
                                         NULL};
    disagree_case("tuning", r, tuning);
}
END_TEST

START_TEST(test_rendezvous_timeout)
{
    env_t e;
    int64_t t0 = fl_now_ms();
    env_start(&e, 3, 100, 3000, 600);
    fl_tp_sock_t *a = fake_open(&e);
    send_reg(a, 0, 3);
    /* Progress heartbeats first: how many are in, who is missing. */
    fl_tp_msg_t m;
    expect_msg(a, FL_MSG_HEARTBEAT, 1000, &m);
    uint32_t nreg = m.hdr.u.heartbeat.registered;
    char missing[FL_MSG_MISSING_MAX];
    snprintf(missing, sizeof missing, "%s", m.hdr.u.heartbeat.missing);
    fl_tp_msg_close(&m);
    ck_assert_uint_eq(nreg, 1);
    ck_assert_str_eq(missing, "1,2");

    fl_msg_error_t err;
    expect_error(a, FL_ETIMEDOUT, 3000, &err);
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(took >= 550, "rendezvous failed after %lld ms, its timeout is 600",
                  (long long)took);
    ASSERT_HAS(err.text, "timed out");
    ASSERT_HAS(err.text, "1 of 3");
    ASSERT_HAS(err.text, "missing 1,2");

    ck_assert_int_eq(fl_coord_wait(e.coord, 2000), FL_EPEER);
    ASSERT_HAS(fl_last_error(), "missing 1,2");

    /* Too late now: the failed job refuses the missing rank. */
    fl_tp_sock_t *b = fake_open(&e);
    send_reg(b, 1, 3);
    expect_error(b, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 1");
    ASSERT_HAS(err.text, "failed");
    env_end(&e);
}
END_TEST

START_TEST(test_rendezvous_drops_silent_rank)
{
    env_t e;
    env_start(&e, 2, 60, 300, 0);
    fl_tp_sock_t *a = fake_open(&e);
    reg_spec_t ra = spec_of(0, 2);
    ra.host = "host-old";
    int64_t t0 = fl_now_ms();
    send_spec(a, &ra);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    /* a never beats: dropped once silent for 300 ms, not before. */
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 0, 2000), 0);
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(took >= 250, "dropped after %lld ms of a 300 ms timeout", (long long)took);
    ck_assert_int_eq(fl_coord_active(e.coord), 0);

    /* Its late heartbeat is counted, not answered. */
    send_ctl(a, FL_MSG_HEARTBEAT, 0);
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_UNEXPECTED, 1, 2000), 1);

    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *c = fake_open(&e);
    send_reg(b, 0, 2);
    send_reg(c, 1, 2);
    fl_tp_msg_t m;
    expect_msg(b, FL_MSG_WELCOME, 2000, &m);
    char host0[FL_HOST_MAX];
    snprintf(host0, sizeof host0, "%s", m.hdr.u.welcome.peers[0].host);
    fl_tp_msg_close(&m);
    ck_assert_str_eq(host0, "host-0");
    expect_welcome(c, 2, NULL);
    expect_quiet(a, 150);
    env_end(&e);
}
END_TEST

/* A rank that leaves during the rendezvous frees its slot; whoever takes it must be watched
 * like any other rank once the job runs. */
START_TEST(test_rendezvous_leave_then_rejoin_is_watched)
{
    env_t e;
    env_start(&e, 2, 50, 400, 0);
    fl_tp_sock_t *a = fake_open(&e);
    send_reg(a, 0, 2);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    send_ctl(a, FL_MSG_SHUTDOWN, 0);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 0, 2000), 0);

    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *c = fake_open(&e);
    send_reg(b, 0, 2);
    send_reg(c, 1, 2);
    expect_welcome(b, 2, NULL);
    expect_welcome(c, 2, NULL);
    /* c beats, b (the new rank 0) goes silent. */
    int64_t deadline = fl_deadline_in(400 + 2000);
    bool got = false;
    fl_msg_error_t err;
    while (!got && fl_now_ms() < deadline) {
        send_ctl(c, FL_MSG_HEARTBEAT, 1);
        fl_tp_msg_t m;
        int64_t slice = fl_deadline_in(40);
        while (!got && fl_tp_recv(c, &m, slice) == FL_OK) {
            if (m.hdr.type == FL_MSG_ERROR) {
                err = m.hdr.u.error;
                got = true;
            }
            fl_tp_msg_close(&m);
        }
    }
    ck_assert_msg(got, "rank 0 re-registered after leaving the rendezvous was silent for "
                       "2.4 s and never declared dead (liveness still says it left)");
    ck_assert_int_eq(err.code, FL_EPEER);
    ck_assert_int_eq(err.about_rank, 0);
    ck_assert_int_eq(fl_coord_wait(e.coord, 1000), FL_EPEER);
    env_end(&e);
}
END_TEST

Suite *coord_rendezvous_suite(void);
Suite *coord_rendezvous_suite(void)
{
    Suite *s = suite_create("coord_rendezvous");
    TCase *t = tcase_create("rendezvous");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_welcome_peer_table);
    tcase_add_test(t, test_duplicate_rank);
    tcase_add_test(t, test_refusals_keep_serving);
    tcase_add_test(t, test_disagreement_fails_rendezvous);
    tcase_add_test(t, test_rendezvous_timeout);
    tcase_add_test(t, test_rendezvous_drops_silent_rank);
    tcase_add_test(t, test_rendezvous_leave_then_rejoin_is_watched);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(coord_rendezvous_suite());
}
