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
    /* guard of a bound ROUTER (tp_guard.c) and its settings */
    int handshake_ivl_ms;
    int pending_max;
    int pending_per_addr;
    size_t hold_max_bytes;
    struct fl_tp_guard *guard;
    struct fl_tp_refusals *refusals; /* malformed messages per connection (tp_refuse.c) */
    /* handshake watch of a connecting socket (tp_watch.c) */
    fl_tp_sock_t *watch;
    int handshakes_closed; /* the watch heard the server close a connection in its handshake */
    /* ZMQ_RCVTIMEO as last set by fl_tp_recv_for (-1: ZeroMQ's default, none) */
    int rcvtimeo;
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

/* ---- senders of malformed messages (tp_refuse.c) ---- */

/* A connection that sends more than FL_TP_REFUSE_BURST malformed messages within
 * FL_TP_REFUSE_WINDOW_MS is reset: a member never sends one, and refusing costs the owner's
 * loop a receive and a scan each. */
#define FL_TP_REFUSE_BURST 32
#define FL_TP_REFUSE_WINDOW_MS 10000
/* A kind of warning about peers (a connection closed, a client refused) is said at most this
 * often; the next line counts those held back (fl_ratelog_say). */
#define FL_TP_LOG_EVERY_MS 10000

typedef struct fl_tp_refusals fl_tp_refusals_t;

/* Counts a refusal (why) of a message that came on descriptor fd from address addr (ZeroMQ's
 * Peer-Address), and resets the connection past the burst: counted as conn_cut, logged at most
 * every 10 s. Refusals of other kinds (another job, another version) are not counted. The
 * socket's owner thread. */
void fl_tp_refuse_note(fl_tp_sock_t *s, int fd, const char *addr, fl_stat_t why);

/* Frees the counts (before the socket closes). */
void fl_tp_refuse_forget(fl_tp_sock_t *s);

/* ---- guard of accepting sockets (tp_guard.c) ---- */

typedef struct fl_tp_guard fl_tp_guard_t;

/* Starts the guard of s before it binds endpoint (a no-op unless s is a ROUTER and endpoint
 * TCP). FL_OK, FL_ENOMEM, FL_EIO. s's owner thread. */
int fl_tp_guard_start(fl_tp_sock_t *s, const char *endpoint);

/* Stops and frees the guard (before zmq_close). NULL-safe. s's owner thread. */
void fl_tp_guard_stop(fl_tp_sock_t *s);

/* Tells the guard that the owner took a message of bytes in frames from descriptor fd. Any
 * thread (atomic). */
void fl_tp_guard_taken(fl_tp_guard_t *g, int fd, uint64_t bytes, uint64_t frames);

/* ---- bytes held for a connection (tp_hold.c) ---- */

/* What the guard knows of one connection's bytes. */
typedef struct fl_tp_hold {
    uint64_t bytes0, frames0; /* the owner's counters of the descriptor when it was accepted */
    int64_t base;             /* bytes read but not taken that are allowed as overhead */
    int64_t last_ms;
    uint64_t held; /* what the last update found */
} fl_tp_hold_t;

void fl_tp_hold_init(fl_tp_hold_t *h, uint64_t bytes, uint64_t frames, int64_t now_ms);

/* True when total, the bytes the guards of ctx hold together, is over the process's bound
 * (fl_ctx_held_max; none when 0). */
bool fl_tp_hold_over(const fl_ctx_t *ctx, uint64_t total);

/* Counts a connection (from ip, to socket sock) cut for the process bound as conn_cut, and
 * says so at most every FL_TP_LOG_EVERY_MS (log: when it was last said). */
void fl_tp_hold_cut_said(fl_ctx_t *ctx, const char *sock, const char *ip, uint64_t held,
                         uint64_t total, int64_t now, fl_ratelog_t *log);

/* Bytes held for the connection now: read from the kernel (pulled) and not taken by the owner
 * (bytes, frames: the owner's counters), less the protocol's overhead (framing, encryption,
 * heartbeats) at generous rates. Pure. */
uint64_t fl_tp_hold_update(fl_tp_hold_t *h, uint64_t pulled, uint64_t bytes, uint64_t frames,
                           int64_t now_ms);

/* Bytes ZeroMQ has read from a TCP descriptor: received less what waits in the kernel.
 * FL_OK or FL_EIO (not a TCP socket, closed). */
int fl_tp_hold_pulled(int fd, uint64_t *out);

/* Bytes received on a TCP descriptor so far (0 when unknown). */
uint64_t fl_tp_hold_received(int fd);

/* This process's resident memory in bytes, read through an open /proc/self/statm (0 when
 * unknown). */
uint64_t fl_tp_hold_rss(int statm_fd);

/* Sets a ZeroMQ socket up as a CURVE server (before bind) or client (before connect) when
 * ctx has keys and the endpoint is not inproc (tp_curve.c). FL_OK or FL_EIO. */
int fl_tp_curve_server(void *zs, const fl_ctx_t *ctx, const char *endpoint);
int fl_tp_curve_client(void *zs, const fl_ctx_t *ctx, const char *endpoint);

/* This process's CURVE client public key (Z85), "" without keys. */
const char *fl_tp_curve_client_key(const fl_ctx_t *ctx);

/* Splits a User-Id of the ZAP handler (tp_curve.c) into the key (into key, cap bytes) and its
 * binding, which it returns (a rank, FL_TP_KEY_SERVER or FL_TP_KEY_ANY). */
int fl_tp_user_bound(const char *user, char *key, size_t cap);

#endif
