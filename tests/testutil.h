/* Helpers shared by the test suites: a suite runner with per-case timeouts, an in-process
 * coordinator, and N ranks run as threads, each with its own communicator. */
#ifndef FL_TESTUTIL_H
#define FL_TESTUTIL_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <flodl/flodl.h>

#include "fl_coll.h"
#include "fl_core.h"
#include "fl_tp.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Fails with both strings shown unless text contains needle. */
#define ASSERT_HAS(text, needle)                                                                   \
    ck_assert_msg(strstr((text), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (text),      \
                  (needle))

/* Runs a suite (fork mode, the suite's case timeouts) and returns the process exit status. */
int fl_test_run(Suite *s);

/* Starts an in-process coordinator for world ranks on tcp://127.0.0.1:0 with the given
 * heartbeat timeout (0: 2000 ms). ck_assert()s on failure. */
fl_coord_t *fl_test_coord(int world, int hb_timeout_ms);

/* Options for rank r of world against coord, with short test deadlines. */
void fl_test_comm_opts(fl_comm_opts_t *o, fl_coord_t *coord, int rank, int world);

/* The body run by each rank thread. Returns FL_OK or an error code. */
typedef int (*fl_test_rank_fn)(fl_comm_t *comm, void *arg);

/* Runs fn on `world` ranks as threads, each with its own communicator made from *base
 * (rank filled in per thread; base may be NULL for fl_test_comm_opts defaults). Returns the
 * first non-OK result (and copies that thread's fl_last_error into err if non-NULL). */
int fl_test_run_ranks(int world, const fl_comm_opts_t *base, fl_test_rank_fn fn, void *arg,
                      char *err, size_t errcap);

/* Probes for a usable CUDA device in a child process: CUDA cannot be used in a child forked
 * after its parent initialized it, and Check runs each case in a forked child, so the test
 * process itself must never touch CUDA before the cases run. Returns 0 when a device is
 * usable, 77 after printing "SKIP: <suite> needs a CUDA device: <why>", 1 on a probe failure
 * or when FLODL_REQUIRE_GPU=1 and there is none (a GPU machine's check must not skip). */
int fl_test_gpu_probe(const char *suite);

/* One line describing a received message: "error -1: text", "shutdown 2: text", "welcome". */
void fl_test_describe_msg(const fl_tp_msg_t *m, char *out, size_t cap);

/* Waits for the next message of type want on s, skipping heartbeats (unless wanted) and
 * refused messages; ck_abort()s on a timeout or another type. The caller closes m. */
void fl_test_expect_msg(fl_tp_sock_t *s, fl_msg_type_t want, int timeout_ms, fl_tp_msg_t *m);

/* Deterministic pseudo-random numbers (splitmix64). */
uint64_t fl_test_rand(uint64_t *state);
double fl_test_uniform(uint64_t *state); /* in [-1, 1) */

#endif
