/* The guard's count of the bytes a connection makes the process hold (transport/tp_hold.c):
 * what was read and not taken, less generous protocol overheads that only grow as used. */
#include <check.h>

#include "testutil.h"
#include "tp_int.h"

START_TEST(test_handshake_and_heartbeats_are_not_held)
{
    fl_tp_hold_t h;
    fl_tp_hold_init(&h, 100, 10, 0);
    /* A handshake's few hundred bytes, then a heartbeat's trickle for an hour. */
    ck_assert_uint_eq(fl_tp_hold_update(&h, 600, 100, 10, 1000), 0);
    uint64_t pulled = 600;
    for (int64_t t = 2000; t <= 3600 * 1000; t += 1000) {
        pulled += 120;
        ck_assert_uint_eq(fl_tp_hold_update(&h, pulled, 100, 10, t), 0);
    }
}
END_TEST

START_TEST(test_messages_taken_are_not_held)
{
    fl_tp_hold_t h;
    fl_tp_hold_init(&h, 0, 0, 0);
    /* Half of a 1 MiB message in flight is held; once taken (2 frames) it is not. */
    ck_assert_uint_ge(fl_tp_hold_update(&h, 4096 + (512 << 10), 0, 0, 10), 500 << 10);
    ck_assert_uint_eq(fl_tp_hold_update(&h, 4096 + (1 << 20) + 80, 1 << 20, 2, 20), 0);
}
END_TEST

START_TEST(test_a_message_that_never_ends_is_held)
{
    fl_tp_hold_t h;
    fl_tp_hold_init(&h, 0, 0, 0);
    /* 100 MiB over a minute, none of it taken: the overhead allowed is a few dozen KiB. */
    uint64_t held = fl_tp_hold_update(&h, (uint64_t)100 << 20, 0, 0, 60000);
    ck_assert_msg(held > ((uint64_t)99 << 20), "expected about 100 MiB held, got %llu",
                  (unsigned long long)held);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tp_hold");
    TCase *t = tcase_create("tp_hold");
    tcase_add_test(t, test_handshake_and_heartbeats_are_not_held);
    tcase_add_test(t, test_messages_taken_are_not_held);
    tcase_add_test(t, test_a_message_that_never_ends_is_held);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
