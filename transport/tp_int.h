/* Private layout of a transport socket, shared by tp_sock.c and tp_msg.c. */
#ifndef FL_TP_INT_H
#define FL_TP_INT_H

#include "fl_tp.h"

struct fl_tp_sock {
    fl_ctx_t *ctx;
    void *zs;
    fl_tp_kind_t kind;
    char name[64];
    size_t max_msg_bytes;
    /* stamp applied to outgoing headers, once set */
    bool stamped;
    char job_id[FL_JOB_MAX];
    uint64_t generation;
    int32_t sender;
    /* filter applied to incoming headers */
    bool expect_set;
    char expect_job[FL_JOB_MAX];
    uint64_t expect_gen;
    /* handshake watch of a connecting socket (tp_watch.c) */
    fl_tp_sock_t *watch;
};

/* ---- monitors (tp_watch.c) ---- */

/* One event of a socket monitor: ZMQ_EVENT_* and its value (a descriptor for ACCEPTED,
 * LISTENING and DISCONNECTED; a status or error code for the handshake's failures). */
typedef struct fl_tp_event {
    int type;
    uint32_t value;
} fl_tp_event_t;

/* Starts ZeroMQ's monitor of zs for events and returns a raw PAIR socket hearing it (no
 * high-water mark: ZeroMQ's I/O thread would stall on a full pipe). FL_OK or FL_EIO. */
int fl_tp_monitor_open(void *zmq_ctx, void *zs, int events, void **pair);

/* Stops the monitor, then closes the pair (in that order: ZeroMQ blocks sending to a pipe
 * nobody reads). zs's owner thread; pair may be NULL after fl_tp_monitor_stop. */
void fl_tp_monitor_stop(void *zs);
void fl_tp_monitor_close(void *zs, void **pair);

/* One event without waiting: 1 when *ev is set, 0 when none is waiting, FL_EIO. */
int fl_tp_monitor_read(void *pair, fl_tp_event_t *ev);

/* Sets a ZeroMQ socket up as a CURVE server (before bind) or client (before connect) when
 * ctx has keys and the endpoint is not inproc (tp_curve.c). FL_OK or FL_EIO. */
int fl_tp_curve_server(void *zs, const fl_ctx_t *ctx, const char *endpoint);
int fl_tp_curve_client(void *zs, const fl_ctx_t *ctx, const char *endpoint);

/* This process's CURVE client public key (Z85), "" without keys. */
const char *fl_tp_curve_client_key(const fl_ctx_t *ctx);

#endif
