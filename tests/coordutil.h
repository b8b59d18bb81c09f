/* Helpers shared by the coordinator suites (test_coord_*.c): an in-process coordinator for a
 * job, connections that play ranks or hostile processes, registrations sent as built or as raw
 * bytes, and waits for the coordinator's answers and counters. */
#ifndef FL_COORDUTIL_H
#define FL_COORDUTIL_H

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "testutil.h"

#define JOB "coord-test"
#define TUNING "seg=1048576,small=65536,algo=0"
#define MAX_FAKES 12

typedef struct env {
    fl_coord_t *coord;
    fl_ctx_t *ctx; /* the fake ranks' context */
    fl_tp_sock_t *fakes[MAX_FAKES];
    int nfakes;
} env_t;

/* A coordinator for `world` ranks of JOB logging at `level`; 0 keeps an option's default. */
void env_start_log(env_t *e, int world, int hb_ms, int hb_timeout_ms, int rdv_ms,
                   fl_log_level_t level);

void env_start(env_t *e, int world, int hb_ms, int hb_timeout_ms, int rdv_ms);

void env_end(env_t *e);

/* A new connection to the coordinator, as a restarted or hostile process would open. */
fl_tp_sock_t *fake_open(env_t *e);

typedef struct reg_spec {
    int rank;
    int world;
    const char *job;
    const char *host; /* NULL: "host-<rank>" */
    int pid;
    const char *tuning;
    int nendpoints;
    const char *settings;
    const char *token; /* NULL: none (a first registration) */
} reg_spec_t;

reg_spec_t spec_of(int rank, int world);

/* The data endpoint a fake rank advertises on stripe k. */
void endpoint_of(int rank, int k, char *out, size_t cap);

void build_register(fl_msg_hdr_t *h, const reg_spec_t *r);

void send_spec(fl_tp_sock_t *s, const reg_spec_t *r);

void send_reg(fl_tp_sock_t *s, int rank, int world);

void send_ctl(fl_tp_sock_t *s, fl_msg_type_t type, int sender);

#define expect_msg fl_test_expect_msg

void expect_error(fl_tp_sock_t *s, int code, int timeout_ms, fl_msg_error_t *out);

/* Fails when anything but a heartbeat arrives within ms. */
void expect_quiet(fl_tp_sock_t *s, int ms);

void expect_welcome(fl_tp_sock_t *s, int world, uint64_t *generation);

/* The welcome on s; its token (the receiver's proof for a later registration) into token,
 * unchecked: a test asserts it once its stranger's claims are made. */
void expect_welcome_token(fl_tp_sock_t *s, int world, char token[FL_MSG_TOKEN_MAX]);

/* Polls fn(coord) until it equals want or timeout_ms passes; returns the last value. */
int wait_count(const fl_coord_t *c, int (*fn)(const fl_coord_t *), int want, int timeout_ms);

uint64_t wait_stat(const fl_coord_t *c, fl_stat_t st, uint64_t want, int timeout_ms);

#endif
