/* Helpers shared by the transport suites (test_tp_*.c): contexts and sockets with test defaults,
 * pairs linked over inproc, ipc or tcp (the ipc files recorded for the teardown), payload
 * patterns, and small marked messages sent and checked. */
#ifndef FL_TPUTIL_H
#define FL_TPUTIL_H

#include <stdint.h>

#include "fl_tp.h"
#include "testutil.h"

enum { XP_INPROC, XP_IPC, XP_TCP, XP_COUNT };

#define WAIT_MS 5000 /* deadline of operations that should succeed at once */

/* ipc socket files made by this test process, removed by the teardown. */
extern char ipc_paths[8][128];
extern int nipc;

/* A context with the default limits, or at most max_frames payload frames when non-zero. */
fl_ctx_t *ctx_new_frames(size_t max_frames);

fl_ctx_t *ctx_new(void);

/* Test defaults: linger 0 so that closing with unread messages never waits. */
void opts_test(fl_tp_opts_t *o);

fl_tp_sock_t *sock_new(fl_ctx_t *ctx, fl_tp_kind_t kind, const char *name,
                       const fl_tp_opts_t *opts);

/* Binds a to a fresh endpoint of transport xp and connects b to the endpoint actually bound,
 * which goes to out (FL_ENDPOINT_MAX bytes) unless that is NULL. */
void link_to(int xp, fl_tp_sock_t *a, fl_tp_sock_t *b, char *out);

void link_socks(int xp, fl_tp_sock_t *a, fl_tp_sock_t *b);

uint8_t pattern(uint64_t salt, size_t frame, size_t j);

void recv_ok(fl_tp_sock_t *s, fl_tp_msg_t *m);

void send_small(fl_tp_sock_t *s, const fl_tp_route_t *to, uint64_t marker);

void check_small(fl_tp_msg_t *m, uint64_t marker);

void recv_small(fl_tp_sock_t *s, uint64_t marker);

uint8_t *pattern_buf(size_t len, uint64_t salt, size_t frame);

#endif
