/* Helpers shared by the collectives suites (test_collectives_*.c): N ranks run as threads, each
 * with its own communicator, against an in-process coordinator on 127.0.0.1 or ipc://, and a
 * rank's wrong result reported as TEST_EBAD with its detail. */
#ifndef FL_COLLUTIL_H
#define FL_COLLUTIL_H

#include "testutil.h"

#define MAX_WORLD 16

#define TEST_EBAD (-100) /* a rank found a wrong result; the detail says what */

/* A rank's wrong result: sets the detail text and returns TEST_EBAD. */
int bad(const char *fmt, ...) FL_PRINTF(1, 2);

/* Communicator options for 127.0.0.1 with the tests' deadlines. */
void opts_base(fl_comm_opts_t *o);

/* Called with the coordinator's endpoint before the ranks start, when set (one test per
 * forked process, so one variable is enough). */
extern void (*before_ranks)(const char *coordinator, const char *job_id);

/* Rank r's advertised host, when set (two loopback addresses act as two hosts). */
extern const char *const *rank_hosts;

/* A rank that runs with ipc turned off, when >= 0. */
extern int ipc_off_rank;

/* Runs fn on world ranks: threads with their own communicators and an in-process coordinator.
 * ipc_tag != NULL: rank r's data endpoint is ipc:///tmp/flodl-coll-<pid>-<tag>-<r>. Fails the
 * test listing every rank's error, wrong results (TEST_EBAD) first: the other errors are mostly
 * peers of the failed rank running into their deadline. */
void run_world_at(int world, const fl_comm_opts_t *o, const char *ipc_tag, fl_test_rank_fn fn,
                  void *arg);

void run_world(int world, const fl_comm_opts_t *o, fl_test_rank_fn fn, void *arg);

#define EXPECT_OK(call)                                                                            \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != FL_OK)                                                                          \
            return rc_ == TEST_EBAD ? rc_                                                          \
                                    : bad("%s: %s: %s", #call, fl_strerror(rc_), fl_last_error()); \
    } while (0)

#endif
