/* The coordinator's options: each field checked and refused by name, a bind address already in
 * use, and a listen queue that holds every member connecting at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "testutil.h"

static int try_create(const fl_coord_opts_t *o)
{
    static char sentinel;
    fl_coord_t *c = (fl_coord_t *)&sentinel; /* create must reset it to NULL on failure */
    int rc = fl_coord_create(o, &c);
    if (rc == FL_OK) {
        fl_coord_destroy(&c);
        return FL_OK;
    }
    ck_assert_msg(c == NULL, "failed create left *out set");
    return rc;
}

static void base_opts(fl_coord_opts_t *o)
{
    fl_coord_opts_init(o);
    o->bind = "tcp://127.0.0.1:0";
    o->world_size = 2;
    o->log_level = FL_LOG_OFF;
}

START_TEST(test_opts_validation)
{
    fl_coord_opts_t o;
    base_opts(&o);
    o.bind = NULL;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "bind");

    base_opts(&o);
    o.bind = "tcp://127.0.0.1";
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "bind");
    o.bind = "smtp://127.0.0.1:25";
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "bind");

    base_opts(&o);
    o.world_size = 0;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "world_size");

    base_opts(&o);
    o.job_id = "";
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "job_id");
    o.job_id = "job\nx"; /* every message carries it: it must be wire text */
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "control characters");

    base_opts(&o);
    o.heartbeat_timeout_ms = 500;
    o.heartbeat_ms = 500;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "heartbeat_ms");
    o.heartbeat_ms = 900;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "heartbeat_ms");

    base_opts(&o);
    o.heartbeat_timeout_ms = 5;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "heartbeat_timeout_ms");

    base_opts(&o);
    o.rendezvous_timeout_ms = 0;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "rendezvous_timeout_ms");

    base_opts(&o);
    ck_assert_int_eq(try_create(&o), FL_OK);
}
END_TEST

START_TEST(test_bind_in_use)
{
    fl_coord_opts_t o;
    base_opts(&o);
    fl_coord_t *first = NULL;
    ck_assert_int_eq(fl_coord_create(&o, &first), FL_OK);
    char ep[FL_ENDPOINT_MAX];
    snprintf(ep, sizeof ep, "%s", fl_coord_endpoint(first));
    ck_assert_msg(strncmp(ep, "tcp://127.0.0.1:", 16) == 0 && atoi(ep + 16) > 0,
                  "bound endpoint %s", ep);
    o.bind = ep;
    ck_assert_int_eq(try_create(&o), FL_EIO);
    ASSERT_HAS(fl_last_error(), ep);
    fl_coord_destroy(&first);
    ck_assert_ptr_null(first);
}
END_TEST

/* The kernel's queue of connections not yet accepted on 127.0.0.1:port, as ss(8) shows it for
 * a listening socket (its Send-Q column); -1 when ss cannot tell. */
static int listen_backlog(int port)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ss -Hltn 'sport = :%d' 2> /dev/null", port);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    char state[32];
    int recvq = -1, sendq = -1;
    int n = fscanf(f, "%31s %d %d", state, &recvq, &sendq);
    pclose(f);
    return n == 3 ? sendq : -1;
}

/* 512 ranks connect at once: beyond ZeroMQ's queue of 100, the rest waited for TCP to send
 * their SYN again, up to 31 s. The queue holds the job's members and a margin. */
START_TEST(test_listen_queue_fits_the_job)
{
    fl_coord_opts_t o;
    base_opts(&o);
    o.world_size = 512;
    fl_coord_t *c = NULL;
    ck_assert_int_eq(fl_coord_create(&o, &c), FL_OK);
    const char *ep = fl_coord_endpoint(c);
    int port = atoi(strrchr(ep, ':') + 1);
    int backlog = listen_backlog(port);
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    int somax = 0;
    ck_assert(f != NULL && fscanf(f, "%d", &somax) == 1);
    fclose(f);
    int want = 512 + 32 < somax ? 512 + 32 : somax;
    ck_assert_msg(backlog == want, "the coordinator's listen queue holds %d, expected %d", backlog,
                  want);
    fl_coord_destroy(&c);
}
END_TEST

Suite *coord_opts_suite(void);
Suite *coord_opts_suite(void)
{
    Suite *s = suite_create("coord_opts");
    TCase *t = tcase_create("options");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_opts_validation);
    tcase_add_test(t, test_bind_in_use);
    tcase_add_test(t, test_listen_queue_fits_the_job);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(coord_opts_suite());
}
