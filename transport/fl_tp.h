/* transport: ZeroMQ sockets that move flodl messages (one header frame + raw payload frames)
 * with a deadline on every wait, limits on sizes and queues, ZMTP heartbeats, and counters of
 * what was refused. Also endpoint parsing and the local-address lookup, and the liveness table
 * of application heartbeats. It knows nothing of gradients or collectives. */
#ifndef FL_TP_H
#define FL_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "fl_core.h"
#include "fl_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fl_tp_kind {
    FL_TP_DEALER = ZMQ_DEALER, /* ranks -> coordinator */
    FL_TP_ROUTER = ZMQ_ROUTER, /* coordinator; ROUTER_MANDATORY is always on */
    FL_TP_PUSH = ZMQ_PUSH,     /* data to one peer, round-robin over its stripes */
    FL_TP_PULL = ZMQ_PULL,     /* data from all peers */
    FL_TP_PAIR = ZMQ_PAIR,     /* inproc pipes between a thread and its IO thread */
} fl_tp_kind_t;

typedef struct fl_tp_opts {
    int sndhwm;             /* messages queued per peer before send waits (default 4096) */
    int rcvhwm;             /* default 4096 */
    int linger_ms;          /* how long close waits for queued messages (default 2000) */
    int zmtp_hb_ivl_ms;     /* ZMTP ping interval on TCP connections (default 1000, 0 = off) */
    int zmtp_hb_timeout_ms; /* drop the connection when no traffic for this (default 5000) */
    int sndbuf;             /* kernel send buffer bytes (0 = OS default) */
    int rcvbuf;             /* kernel receive buffer bytes (0 = OS default) */
    size_t max_msg_bytes;   /* largest accepted frame; 0 = the context's limit. Frames up to
                               twice this (on a guarded socket, up to hold_max_bytes if more) are
                               read, refused and counted; larger ones make ZeroMQ drop the
                               connection, uncounted. */
    bool immediate;         /* queue only on completed connections (ZMQ_IMMEDIATE) */
    const char *routing_id; /* DEALER: the identity a ROUTER sees, kept across reconnects
                               (1..255 bytes; NULL: ZeroMQ picks one per connection) */
    bool router_handover;   /* ROUTER: a new connection with a known identity takes over the
                               old one (a peer that reconnected) instead of being refused */
    int backlog;            /* bound sockets: connections the kernel queues before they are
                               accepted (0: ZeroMQ's 100; the kernel caps it at somaxconn) */
    /* A ROUTER bound on TCP is guarded (tp_guard.c): its connections must complete their
     * handshake within handshake_ivl_ms; those still in it beyond pending_per_addr from one
     * address or pending_max in all are closed (counted as conn_dropped); a connection that
     * makes the process hold more than hold_max_bytes of messages not yet taken is closed
     * (counted as oversized). Without that bound (none above 4 GiB), its connections still
     * count towards the process's (fl_ctx_held_max). 0 picks the default. */
    int handshake_ivl_ms;  /* default 10000 */
    int pending_max;       /* default a quarter of the open-files limit, within 64..4096 */
    int pending_per_addr;  /* default 32 (flodl-ps: the job's members + 32) */
    size_t hold_max_bytes; /* default (max frames + 1) x max_msg_bytes, none above 4 GiB */
} fl_tp_opts_t;

void fl_tp_opts_init(fl_tp_opts_t *opts);

typedef struct fl_tp_sock fl_tp_sock_t;

/* Creates a socket with opts applied. name appears in logs and errors ("data", "coord").
 * FL_OK, FL_EINVAL, FL_ENOMEM, FL_EIO. */
int fl_tp_sock_create(fl_ctx_t *ctx, fl_tp_kind_t kind, const fl_tp_opts_t *opts, const char *name,
                      fl_tp_sock_t **out);

/* Closes (lingering up to linger_ms for queued messages) and frees. NULL-safe. */
void fl_tp_sock_destroy(fl_tp_sock_t **sock);

/* Changes the linger of a socket before destroy: 0 drops queued messages at once (used after
 * a failure, so the release hooks of zero-copy sends run promptly). */
void fl_tp_sock_set_linger(fl_tp_sock_t *sock, int linger_ms);

/* Binds; the endpoint actually bound (port chosen for port 0) goes to bound (may be NULL).
 * FL_OK, FL_EINVAL (bad endpoint), FL_EIO (address in use, ...). */
int fl_tp_sock_bind(fl_tp_sock_t *sock, const char *endpoint, char *bound, size_t cap);

/* Connects (asynchronously: ZeroMQ retries until the peer is up). FL_OK or FL_EINVAL/FL_EIO. */
int fl_tp_sock_connect(fl_tp_sock_t *sock, const char *endpoint);

/* Stamps every outgoing header with job id, generation and sender rank. */
void fl_tp_sock_set_stamp(fl_tp_sock_t *sock, const char *job_id, uint64_t generation,
                          int32_t sender);

/* Refuses (and counts) incoming messages of another job id or generation. job_id NULL: any. */
void fl_tp_sock_set_expect(fl_tp_sock_t *sock, const char *job_id, uint64_t generation);

const char *fl_tp_sock_name(const fl_tp_sock_t *sock);
fl_ctx_t *fl_tp_sock_ctx(const fl_tp_sock_t *sock);

/* The identity of a ROUTER's peer. */
typedef struct fl_tp_route {
    uint8_t id[256];
    size_t len;
} fl_tp_route_t;

/* One received message. Frames stay in ZeroMQ's memory (no copy) until fl_tp_msg_close. */
typedef struct fl_tp_msg {
    fl_msg_hdr_t hdr;
    fl_tp_route_t route; /* ROUTER sockets: the sender's identity */
    char peer_key[48];   /* with CURVE: the client key the sender authenticated with (Z85,
                            40 characters); "" in plain text */
    int peer_bound;      /* with CURVE: the member that key is bound to (FL_TP_KEY_*, or a
                            rank); FL_TP_KEY_ANY for the job's shared key and in plain text */
    size_t nframes;
    zmq_msg_t frames[FL_MSG_MAX_FRAMES];
} fl_tp_msg_t;

/* Sends h (stamped with the socket's job, generation and sender) followed by n payload frames.
 * to: the peer for a ROUTER socket, NULL otherwise. The header's frame descriptions get their
 * byte sizes from frames[]; dtype and codec are the caller's. A frame with a release hook is
 * sent without copying: the transport owns it from this call on and calls the hook exactly
 * once, when ZeroMQ is done with the memory (possibly from ZeroMQ's I/O thread) or at once if
 * the send fails. A frame without a hook is copied before the call returns.
 * Waits until deadline_ms (absolute, fl_deadline_in) when the queue is full; a ROUTER never
 * waits (FL_ETIMEDOUT at once: one slow peer must not stall a server).
 * FL_OK, FL_ETIMEDOUT, FL_EPEER (ROUTER: no such peer), FL_EINVAL, FL_EIO. */
int fl_tp_send(fl_tp_sock_t *sock, const fl_tp_route_t *to, fl_msg_hdr_t *h, fl_buf_t *frames,
               size_t n, int64_t deadline_ms);

/* Receives one message, waiting until deadline_ms. FL_OK: m holds a validated message, the
 * caller closes it. FL_EPROTO: a message arrived but was refused (counted, logged at debug,
 * frames already closed); m->route and whatever of m->hdr could be decoded are set so the
 * caller can answer. FL_ETIMEDOUT, FL_EIO. */
int fl_tp_recv(fl_tp_sock_t *sock, fl_tp_msg_t *m, int64_t deadline_ms);

/* fl_tp_recv without waiting and without a poll: returns FL_ETIMEDOUT at once (and sets no
 * detail text) when no message is waiting. For loops that poll several sockets themselves. */
int fl_tp_try_recv(fl_tp_sock_t *sock, fl_tp_msg_t *m);

/* fl_tp_recv for at most timeout_ms (>= 0), waiting inside ZeroMQ's receive (one wait on the
 * socket) rather than in a poll, which costs several system calls more per message. FL_ETIMEDOUT
 * (no detail text) when nothing came; otherwise as fl_tp_recv. Not for ROUTER sockets (they
 * take fl_tp_recv). */
int fl_tp_recv_for(fl_tp_sock_t *sock, fl_tp_msg_t *m, int timeout_ms);

/* Releases the frames of m and its header. NULL-safe, idempotent. */
void fl_tp_msg_close(fl_tp_msg_t *m);

static inline const void *fl_tp_msg_data(fl_tp_msg_t *m, size_t i)
{
    return zmq_msg_data(&m->frames[i]);
}

static inline size_t fl_tp_msg_size(fl_tp_msg_t *m, size_t i)
{
    return zmq_msg_size(&m->frames[i]);
}

/* Most sockets one poll takes. */
#define FL_TP_POLL_MAX 8192

/* Waits until one of the sockets is readable or timeout_ms passes. ready[i] is set true for
 * the readable ones. Returns the number ready (0 on timeout), FL_EINVAL (more than
 * FL_TP_POLL_MAX), FL_ENOMEM or FL_EIO. */
int fl_tp_poll(fl_tp_sock_t *const *socks, size_t n, int timeout_ms, bool *ready);

/* Has sock watch its connections' handshakes; call before connect. *pipe (owned by sock, freed
 * with it) becomes readable when one failed; fl_tp_sock_handshake_check then says whether the
 * server refused this process. FL_OK or FL_EIO. One thread at a time, with sock's. */
int fl_tp_sock_watch(fl_tp_sock_t *sock, fl_tp_sock_t **pipe);

/* Reads the events the watch heard. FL_OK when none is a refusal; FL_EPEER when the server at
 * endpoint refused this process's CURVE key ("refused by the server's allowlist") or speaks
 * another security (plain text against CURVE), the text naming what to change. A handshake
 * that merely failed (the server went away, or closed it: a busy or flooded server) is not a
 * refusal: ZeroMQ tries again, and fl_tp_sock_handshakes_closed counts it. */
int fl_tp_sock_handshake_check(fl_tp_sock_t *sock, const char *endpoint);

/* How many of sock's connections the watch heard closed in their handshake, ever. */
int fl_tp_sock_handshakes_closed(const fl_tp_sock_t *sock);

/* How long ZeroMQ waits before it connects again after a connection ended (ZMQ_RECONNECT_IVL;
 * ZeroMQ adds up to as much again at random). */
void fl_tp_sock_set_reconnect_ivl(fl_tp_sock_t *sock, int ms);

/* Sends raw frames without a flodl header: only for tests that play a broken or hostile peer.
 * FL_OK or FL_EIO. */
int fl_tp_send_raw(fl_tp_sock_t *sock, const void *const *parts, const size_t *sizes, size_t n);

/* ---- endpoints (tp_endpoint.c) ---- */

typedef enum fl_tp_scheme {
    FL_TP_TCP = 1,
    FL_TP_IPC = 2,
    FL_TP_INPROC = 3,
} fl_tp_scheme_t;

typedef struct fl_tp_endpoint {
    fl_tp_scheme_t scheme;
    char host[FL_HOST_MAX]; /* tcp: host or address ("*" for any); ipc: path; inproc: name */
    int port;               /* tcp only; 0 = ephemeral */
} fl_tp_endpoint_t;

/* Parses "tcp://host:port", "tcp://[v6addr]:port", "ipc://path", "inproc://name".
 * FL_OK or FL_EINVAL saying what is wrong. */
int fl_tp_endpoint_parse(const char *endpoint, fl_tp_endpoint_t *out);

/* The local IP address of the route to a tcp endpoint's host (no packet is sent), or
 * 127.0.0.1 for ipc/inproc. FL_OK, FL_EINVAL (unknown host), FL_EIO. */
int fl_tp_local_addr_towards(const char *endpoint, char *out, size_t cap);

/* Rewrites a bound endpoint ("tcp://0.0.0.0:4242") into the one peers dial
 * ("tcp://host:4242"). ipc and inproc endpoints are copied as they are. */
int fl_tp_endpoint_advertise(const char *bound, const char *host, char *out, size_t cap);

/* True when s is an IPv4 or IPv6 address literal. */
bool fl_tp_is_ip_literal(const char *s);

/* ---- liveness (tp_live.c): pure bookkeeping of application heartbeats ---- */

typedef enum fl_tp_peer_state {
    FL_PEER_UNKNOWN = 0, /* never heard from */
    FL_PEER_ALIVE = 1,
    FL_PEER_DEAD = 2, /* silent past the timeout */
    FL_PEER_GONE = 3, /* left cleanly */
} fl_tp_peer_state_t;

typedef struct fl_tp_live fl_tp_live_t;

int fl_tp_live_create(int npeers, int timeout_ms, fl_tp_live_t **out);
void fl_tp_live_destroy(fl_tp_live_t **live);

/* Records a message from peer at now_ms (makes an UNKNOWN peer ALIVE; DEAD and GONE stay). */
void fl_tp_live_heard(fl_tp_live_t *live, int peer, int64_t now_ms);

/* Marks a peer as having left cleanly: it is never declared dead afterwards. */
void fl_tp_live_gone(fl_tp_live_t *live, int peer);

/* Forgets a peer (back to UNKNOWN), e.g. a registration dropped before the job started. */
void fl_tp_live_forget(fl_tp_live_t *live, int peer);

/* Declares dead, and returns, the next ALIVE peer silent for longer than the timeout at
 * now_ms; -1 when none. *silent_ms gets how long it was silent. */
int fl_tp_live_check(fl_tp_live_t *live, int64_t now_ms, int64_t *silent_ms);

fl_tp_peer_state_t fl_tp_live_state(const fl_tp_live_t *live, int peer);
int64_t fl_tp_live_last(const fl_tp_live_t *live, int peer);

/* ---- membership (tp_member.c): the member side of the coordinator protocol ---- */

typedef struct fl_tp_member fl_tp_member_t;

typedef struct fl_tp_member_opts {
    const char *coordinator;   /* endpoint (required) */
    const char *job_id;        /* default "flodl" */
    const char *name;          /* how texts and logs call this member: "rank 3" */
    int32_t sender;            /* stamped on its messages: the rank, or FL_MSG_SENDER_SERVER */
    int rendezvous_timeout_ms; /* deadline of fl_tp_member_join (default 300000) */
    int reconnect_timeout_ms;  /* > 0: when the coordinator goes away before the job ends
                                  (silence, or a shutdown with a non-zero code), register again
                                  for this long instead of failing (default 0) */
} fl_tp_member_opts_t;

/* What the control thread reports in every heartbeat; the owner writes it at any time. */
typedef struct fl_tp_status {
    _Atomic uint32_t op;        /* operation in flight (0: none) */
    _Atomic uint64_t seq;       /* its sequence number */
    _Atomic uint32_t step;      /* its progress */
    _Atomic int32_t waiting_on; /* the rank awaited, -1 when none */
    /* Events the control thread has posted so far (counted before each is sent): while it is
     * 0 the owner need not poll the events pipe before every operation. */
    _Atomic uint32_t posted;
} fl_tp_status_t;

/* The code of the SHUTDOWN event that says the coordinator went away and the member is
 * registering again. */
#define FL_TP_MEMBER_LOST 1

void fl_tp_member_opts_init(fl_tp_member_opts_t *opts);

/* Creates a member in ctx (nothing is sent yet). FL_OK, FL_EINVAL naming the option,
 * FL_ENOMEM, FL_EIO. */
int fl_tp_member_create(fl_ctx_t *ctx, const fl_tp_member_opts_t *opts, fl_tp_member_t **out);

/* Registers reg (kept, with its tables, for reconnects) and waits for the welcome until the
 * rendezvous deadline (or fl_tp_member_cancel: FL_ECLOSED), heartbeating meanwhile and
 * registering again (backing off from 250 ms to 4 s) while the coordinator is silent. FL_OK:
 * *welcome holds the decoded welcome (the caller deinits it) and the member took its generation and
 * heartbeat settings. Otherwise the coordinator's refusal (its code, FL_EPEER when it gave none,
 * with its text), FL_EPROTO (a welcome with impossible heartbeat settings), FL_ETIMEDOUT (saying
 * how far the rendezvous got), FL_EIO. */
int fl_tp_member_join(fl_tp_member_t *m, const fl_msg_register_t *reg, fl_msg_hdr_t *welcome);

/* Makes a join in progress in another thread return FL_ECLOSED at once (a stop during the
 * rendezvous). A cancel that arrives after the join stops the control thread instead. */
void fl_tp_member_cancel(fl_tp_member_t *m);

/* Starts the control thread; only after a successful join. FL_OK, FL_EINVAL, FL_EIO. */
int fl_tp_member_start(fl_tp_member_t *m);

/* The pipe the owner polls and reads (fl_tp_recv) for events of the control thread:
 *   ERROR: fatal (a peer died, the job was aborted, the coordinator was lost for good): code,
 *          the rank it is about, its host and the text;
 *   SHUTDOWN with code 0: the coordinator ended the job cleanly;
 *   SHUTDOWN with code FL_TP_MEMBER_LOST: the coordinator went away and the member is
 *          registering again (only with a reconnect timeout);
 *   WELCOME: the member rejoined a (restarted) coordinator: the new generation and tables.
 * After an ERROR or a SHUTDOWN with code 0 nothing more is posted. */
fl_tp_sock_t *fl_tp_member_events(fl_tp_member_t *m);

/* A further pipe that hears the fatal events (ERROR, SHUTDOWN with code 0) the control thread
 * posts, for another thread to poll: a sub-communicator used by its own thread. A fatal event
 * posted before the tap was made is replayed on it at once. The pipe is owned by m; the caller
 * reads it from one thread and gives it back with fl_tp_member_untap before destroying m.
 * FL_OK, FL_EINVAL (more than FL_TP_MEMBER_MAX_TAPS taps), FL_EIO. */
#define FL_TP_MEMBER_MAX_TAPS 64
int fl_tp_member_tap(fl_tp_member_t *m, fl_tp_sock_t **out);
void fl_tp_member_untap(fl_tp_member_t *m, fl_tp_sock_t **tap);

/* The status heartbeats carry; owned by m. */
fl_tp_status_t *fl_tp_member_status(fl_tp_member_t *m);

/* Generation of the job as of the latest welcome. */
uint64_t fl_tp_member_generation(const fl_tp_member_t *m);

/* Leaves the job (a SHUTDOWN with code and text to the coordinator) and joins the control
 * thread. Does nothing when it is not running. */
void fl_tp_member_stop(fl_tp_member_t *m, int code, const char *text);

/* Stops (code 1) if still running and frees. NULL-safe; sets *m = NULL. */
void fl_tp_member_destroy(fl_tp_member_t **m);

/* ---- CurveZMQ (tp_curve.c) ---- */

typedef struct fl_tp_curve fl_tp_curve_t;

/* What a client key in the allowlist is bound to: a rank (0 or more), the parameter-server
 * processes, or any member (the job's shared key). From the key file's metadata: `rank = "K"`,
 * `role = "server"`, or neither. */
#define FL_TP_KEY_ANY (-1)
#define FL_TP_KEY_SERVER (-2)

/* Loads a key directory: server.key (the job's server key pair: every bound socket of the job
 * uses it; clients trust its public half), this process's client key pair, authorized/ (*.pub:
 * the client public keys allowed in, each maybe bound to a member; at least one). The client
 * key is DIR/<self>.key when self is given and that file exists (a per-rank key: "rank-3",
 * "ps"), else DIR/client.key; self NULL: a process that only binds, which may have none. Key
 * files hold Z85 lines `public-key = "..."` / `secret-key = "..."` (czmq's certificates work).
 * FL_OK, or FL_EINVAL naming the file: missing, malformed, a secret key readable by others or
 * writable by its group, a bad binding, an empty allowlist, a libzmq without CURVE. */
int fl_tp_curve_load(const char *dir, const char *self, fl_tp_curve_t **out);
void fl_tp_curve_free(fl_tp_curve_t *c);

/* Every TCP and IPC socket of ctx made after this uses CURVE: bound ones as servers checked by
 * a ZAP handler thread (started here) against the allowlist, connecting ones as clients. ctx
 * takes c (freed with the context, also on failure). FL_OK, FL_EINVAL, FL_EIO. */
int fl_tp_curve_attach(fl_ctx_t *ctx, fl_tp_curve_t *c);

/* fl_tp_curve_load then fl_tp_curve_attach; dir NULL: nothing (plain text). */
int fl_tp_curve_use(fl_ctx_t *ctx, const char *dir, const char *self);

/* True when ctx's sockets use CURVE. */
bool fl_tp_curve_on(const fl_ctx_t *ctx);

/* Writes base.key (a new key pair, mode 600) and base.pub (its public key, mode 644), each
 * atomically; comment goes into the files' first line, bound (a rank, FL_TP_KEY_SERVER or
 * FL_TP_KEY_ANY) into their metadata. FL_OK or FL_EIO naming the path. */
int fl_tp_curve_keygen(const char *base, const char *comment, int bound);

#ifdef __cplusplus
}
#endif

#endif
