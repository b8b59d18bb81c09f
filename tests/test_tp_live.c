/* The liveness table of transport/ (tp_live.c): argument checks, the exact timeout edge,
 * peers declared dead once and one per call, DEAD and GONE sticky, gone peers never declared
 * dead, forget and revive, out-of-range indices ignored, and the last-heard times. Pure
 * bookkeeping: every time is passed in, so nothing here sleeps. */
#include <stdint.h>
#include <string.h>

#include "fl_tp.h"
#include "testutil.h"

#define T0 1000000 /* an arbitrary monotonic time in ms */

static fl_tp_live_t *live_new(int npeers, int timeout_ms)
{
    fl_tp_live_t *l = NULL;
    int rc = fl_tp_live_create(npeers, timeout_ms, &l);
    ck_assert_msg(rc == FL_OK, "fl_tp_live_create(%d, %d): %s", npeers, timeout_ms,
                  fl_last_error());
    ck_assert_ptr_nonnull(l);
    return l;
}

START_TEST(test_create_validates)
{
    static const int bad[][2] = {{0, 100}, {-1, 100}, {4, 0}, {4, -5}, {0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        static char not_null;
        fl_tp_live_t *l = (fl_tp_live_t *)&not_null; /* so the reset to NULL is visible */
        fl_error_clear();
        int rc = fl_tp_live_create(bad[i][0], bad[i][1], &l);
        if (rc != FL_EINVAL || l != NULL)
            ck_abort_msg("create(%d, %d): rc %d, out %p; want FL_EINVAL and NULL", bad[i][0],
                         bad[i][1], rc, (void *)l);
        if (strstr(fl_last_error(), "liveness") == NULL)
            ck_abort_msg("create(%d, %d): detail '%s' does not name the liveness table", bad[i][0],
                         bad[i][1], fl_last_error());
    }
    fl_tp_live_t *l = live_new(1, 1);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_UNKNOWN);
    fl_tp_live_destroy(&l);
    ck_assert_ptr_null(l);
    fl_tp_live_destroy(&l); /* NULL-safe */
    fl_tp_live_destroy(NULL);
}
END_TEST

START_TEST(test_unknown_never_dead)
{
    fl_tp_live_t *l = live_new(4, 100);
    int64_t silent = -7;
    ck_assert_int_eq(fl_tp_live_check(l, T0, &silent), -1);
    ck_assert_int_eq(fl_tp_live_check(l, INT64_MAX / 2, &silent), -1);
    ck_assert_int_eq(silent, -7);
    for (int p = 0; p < 4; p++) {
        if (fl_tp_live_state(l, p) != FL_PEER_UNKNOWN || fl_tp_live_last(l, p) != 0)
            ck_abort_msg("peer %d: state %d last %lld, want UNKNOWN and 0", p,
                         (int)fl_tp_live_state(l, p), (long long)fl_tp_live_last(l, p));
    }
    fl_tp_live_destroy(&l);
}
END_TEST

START_TEST(test_heard_makes_alive)
{
    fl_tp_live_t *l = live_new(3, 100);
    fl_tp_live_heard(l, 1, T0);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_ALIVE);
    ck_assert_int_eq(fl_tp_live_last(l, 1), T0);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_UNKNOWN);
    ck_assert_int_eq(fl_tp_live_state(l, 2), FL_PEER_UNKNOWN);
    /* Hearing again moves the silence window: 60 ms after the second message is fine even
     * though it is 150 ms after the first. */
    fl_tp_live_heard(l, 1, T0 + 90);
    ck_assert_int_eq(fl_tp_live_last(l, 1), T0 + 90);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 150, NULL), -1);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_ALIVE);
    fl_tp_live_destroy(&l);
}
END_TEST

START_TEST(test_timeout_edge)
{
    fl_tp_live_t *l = live_new(2, 100);
    fl_tp_live_heard(l, 0, T0);
    int64_t silent = -1;
    /* Silent for exactly the timeout: still alive. */
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 100, &silent), -1);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_ALIVE);
    /* One millisecond more: dead, reported once with how long it was silent. */
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 101, &silent), 0);
    ck_assert_int_eq(silent, 101);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_DEAD);
    silent = -1;
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 101, &silent), -1);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 100000, &silent), -1);
    ck_assert_int_eq(silent, -1);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_UNKNOWN);
    fl_tp_live_destroy(&l);
}
END_TEST

START_TEST(test_several_dead_one_per_call)
{
    enum { N = 5 };
    fl_tp_live_t *l = live_new(N, 100);
    /* Peers 0, 2, 3 fall silent at different times; peer 1 keeps talking; peer 4 never spoke. */
    fl_tp_live_heard(l, 0, T0);
    fl_tp_live_heard(l, 2, T0 + 10);
    fl_tp_live_heard(l, 3, T0 + 20);
    fl_tp_live_heard(l, 1, T0 + 150);
    int64_t now = T0 + 200;
    int64_t want_silent[N] = {200, -1, 190, 180, -1};
    int seen[N] = {0};
    int calls = 0;
    int p;
    int64_t silent = 0;
    while ((p = fl_tp_live_check(l, now, &silent)) >= 0 && calls < 10) {
        calls++;
        if (p >= N || want_silent[p] < 0)
            ck_abort_msg("check returned peer %d, which is not silent", p);
        if (seen[p]++ != 0)
            ck_abort_msg("peer %d declared dead twice", p);
        if (silent != want_silent[p])
            ck_abort_msg("peer %d: silent %lld ms, want %lld", p, (long long)silent,
                         (long long)want_silent[p]);
    }
    ck_assert_int_eq(calls, 3);
    ck_assert_int_eq(p, -1);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_DEAD);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_ALIVE);
    ck_assert_int_eq(fl_tp_live_state(l, 2), FL_PEER_DEAD);
    ck_assert_int_eq(fl_tp_live_state(l, 3), FL_PEER_DEAD);
    ck_assert_int_eq(fl_tp_live_state(l, 4), FL_PEER_UNKNOWN);
    fl_tp_live_destroy(&l);
}
END_TEST

START_TEST(test_dead_and_gone_sticky)
{
    fl_tp_live_t *l = live_new(3, 100);
    fl_tp_live_heard(l, 0, T0);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 500, NULL), 0);
    /* A late message does not revive a peer already declared dead. */
    fl_tp_live_heard(l, 0, T0 + 600);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_DEAD);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 100000, NULL), -1);

    /* A peer that left cleanly stays gone, whatever arrives after its goodbye, and is never
     * declared dead however long it stays silent. */
    fl_tp_live_heard(l, 1, T0);
    fl_tp_live_gone(l, 1);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_GONE);
    fl_tp_live_heard(l, 1, T0 + 50);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_GONE);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 100000, NULL), -1);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_GONE);

    /* Gone before ever being heard: also never dead, and a later message does not revive. */
    fl_tp_live_gone(l, 2);
    ck_assert_int_eq(fl_tp_live_state(l, 2), FL_PEER_GONE);
    fl_tp_live_heard(l, 2, T0 + 100);
    ck_assert_int_eq(fl_tp_live_state(l, 2), FL_PEER_GONE);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 100000, NULL), -1);
    fl_tp_live_destroy(&l);
}
END_TEST

START_TEST(test_forget_and_revive)
{
    fl_tp_live_t *l = live_new(2, 100);
    fl_tp_live_heard(l, 0, T0);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 200, NULL), 0);
    fl_tp_live_forget(l, 0);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_UNKNOWN);
    ck_assert_int_eq(fl_tp_live_last(l, 0), 0);
    /* Forgotten: not declared dead again, however long. */
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 100000, NULL), -1);
    /* Heard again: alive, with the new time, and subject to the timeout once more. */
    fl_tp_live_heard(l, 0, T0 + 1000);
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_ALIVE);
    ck_assert_int_eq(fl_tp_live_last(l, 0), T0 + 1000);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 1100, NULL), -1);
    int64_t silent = 0;
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 1101, &silent), 0);
    ck_assert_int_eq(silent, 101);

    /* A gone peer can be forgotten and come back too. */
    fl_tp_live_gone(l, 1);
    fl_tp_live_forget(l, 1);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_UNKNOWN);
    fl_tp_live_heard(l, 1, T0 + 5);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_ALIVE);
    fl_tp_live_destroy(&l);
}
END_TEST

START_TEST(test_out_of_range_ignored)
{
    fl_tp_live_t *l = live_new(2, 100);
    static const int bad[] = {-1, 2, 3, -1000, 1 << 30};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fl_tp_live_heard(l, bad[i], T0);
        fl_tp_live_gone(l, bad[i]);
        fl_tp_live_forget(l, bad[i]);
        if (fl_tp_live_state(l, bad[i]) != FL_PEER_UNKNOWN || fl_tp_live_last(l, bad[i]) != 0)
            ck_abort_msg("peer %d: out of range but state %d last %lld", bad[i],
                         (int)fl_tp_live_state(l, bad[i]), (long long)fl_tp_live_last(l, bad[i]));
    }
    /* The real peers were not touched by any of it. */
    ck_assert_int_eq(fl_tp_live_state(l, 0), FL_PEER_UNKNOWN);
    ck_assert_int_eq(fl_tp_live_state(l, 1), FL_PEER_UNKNOWN);
    ck_assert_int_eq(fl_tp_live_check(l, T0 + 100000, NULL), -1);
    fl_tp_live_destroy(&l);
}
END_TEST

START_TEST(test_last)
{
    fl_tp_live_t *l = live_new(3, 1000);
    fl_tp_live_heard(l, 0, T0 + 1);
    fl_tp_live_heard(l, 2, T0 + 2);
    fl_tp_live_heard(l, 2, T0 + 3);
    ck_assert_int_eq(fl_tp_live_last(l, 0), T0 + 1);
    ck_assert_int_eq(fl_tp_live_last(l, 1), 0);
    ck_assert_int_eq(fl_tp_live_last(l, 2), T0 + 3);
    fl_tp_live_destroy(&l);
}
END_TEST

Suite *tp_live_suite(void);
Suite *tp_live_suite(void)
{
    Suite *s = suite_create("tp_live");
    TCase *t = tcase_create("live");
    tcase_set_timeout(t, 10);
    tcase_add_test(t, test_create_validates);
    tcase_add_test(t, test_unknown_never_dead);
    tcase_add_test(t, test_heard_makes_alive);
    tcase_add_test(t, test_timeout_edge);
    tcase_add_test(t, test_several_dead_one_per_call);
    tcase_add_test(t, test_dead_and_gone_sticky);
    tcase_add_test(t, test_forget_and_revive);
    tcase_add_test(t, test_out_of_range_ignored);
    tcase_add_test(t, test_last);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(tp_live_suite());
}
