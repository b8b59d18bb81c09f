/* The guard's count of the bytes a connection makes the process hold (transport/tp_hold.c):
 * what was read and not taken, less generous protocol overheads that only grow as used. */
#include <check.h>
#include <stdlib.h>
#include <unistd.h>

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

/* A socket whose messages may be as large as a shard's (none over 4 GiB) has no bound of one
 * connection, and its connections still count towards the process's: messages sent to it and
 * left untaken past the context's bound get the sender's connection cut. */
START_TEST(test_unbounded_socket_meets_the_process_bound)
{
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.max_msg_bytes = (size_t)1 << 40;
    co.held_max_bytes = (size_t)8 << 20;
    fl_ctx_t *ctx = NULL;
    ck_assert_int_eq(fl_ctx_create(&co, &ctx), FL_OK);
    fl_tp_opts_t o;
    fl_tp_opts_init(&o);
    o.linger_ms = 0;
    fl_tp_sock_t *shard = NULL;
    fl_tp_sock_t *rank = NULL;
    char ep[FL_ENDPOINT_MAX];
    ck_assert_int_eq(fl_tp_sock_create(ctx, FL_TP_ROUTER, &o, "shard", &shard), FL_OK);
    ck_assert_int_eq(fl_tp_sock_bind(shard, "tcp://127.0.0.1:0", ep, sizeof ep), FL_OK);
    ck_assert_int_eq(fl_tp_sock_create(ctx, FL_TP_DEALER, &o, "rank", &rank), FL_OK);
    ck_assert_int_eq(fl_tp_sock_connect(rank, ep), FL_OK);
    enum { PUSHES = 6, PUSH = 4 << 20 }; /* 24 MiB, three times the bound */
    uint8_t *push = calloc(1, PUSH);
    ck_assert_ptr_nonnull(push);
    for (int i = 0; i < PUSHES; i++) {
        fl_msg_hdr_t h;
        fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
        fl_buf_t f = {.data = push, .len = PUSH};
        ck_assert_int_eq(fl_tp_send(rank, NULL, &h, &f, 1, fl_deadline_in(5000)), FL_OK);
    }
    int64_t until = fl_deadline_in(10000);
    while (fl_ctx_stat(ctx, FL_STAT_CONN_CUT) == 0 && fl_now_ms() < until)
        usleep(20 * 1000);
    ck_assert_msg(fl_ctx_stat(ctx, FL_STAT_CONN_CUT) >= 1,
                  "expected the connection holding %d MiB untaken, over the process bound of "
                  "8 MiB, to be cut",
                  (PUSHES * PUSH) >> 20);
    fl_tp_sock_destroy(&rank);
    fl_tp_sock_destroy(&shard);
    fl_ctx_destroy(&ctx);
    free(push);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tp_hold");
    TCase *t = tcase_create("tp_hold");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_handshake_and_heartbeats_are_not_held);
    tcase_add_test(t, test_messages_taken_are_not_held);
    tcase_add_test(t, test_a_message_that_never_ends_is_held);
    tcase_add_test(t, test_unbounded_socket_meets_the_process_bound);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
