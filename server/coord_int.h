/* Private to server/: the coordinator's state, shared by coord.c (lifecycle, thread, waiting),
 * coord_handle.c (messages) and coord_tick.c (heartbeats, liveness). All of it is touched by
 * the coordinator thread only, except the fields under `lock`. */
#ifndef FL_COORD_INT_H
#define FL_COORD_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"

typedef enum coord_phase {
    PHASE_RENDEZVOUS = 0,
    PHASE_RUNNING = 1,
    PHASE_FAILED = 2, /* a rank died or the rendezvous failed; waiting for the rest to go */
} coord_phase_t;

typedef struct coord_rank {
    bool registered;
    bool left;
    fl_tp_route_t route;
    char key[48]; /* with CURVE: the client key it registered with (fl_tp_msg_t.peer_key) */
    char token[FL_MSG_TOKEN_MAX]; /* its secret, sent in its welcome; "" once it is gone */
    fl_msg_register_t reg;
    /* last heartbeat's view of what the rank was doing */
    uint32_t op;
    uint64_t op_seq;
    uint32_t op_step;
    int32_t waiting_on;
    int64_t progress_ms; /* when its collective (sequence or step) last changed */
    /* how it left: its goodbye's code (0: cleanly) and text; failed: it stopped the job */
    int leave_code;
    char leave_text[FL_MSG_TEXT_MAX];
    bool failed;
    bool heard;   /* a registration for it came, accepted or not */
    bool refused; /* its registration disagreed with the others' (leave_text: why) */
} coord_rank_t;

/* A parameter-server process: it serves shards [reg.rank, reg.rank + reg.shard_count). */
typedef struct coord_server {
    bool registered;
    bool left;
    fl_tp_route_t route;
    char key[48];                 /* with CURVE: the client key it registered with */
    char token[FL_MSG_TOKEN_MAX]; /* its secret, sent in its welcome */
    fl_msg_register_t reg;        /* owns reg.shard_eps */
} coord_server_t;

struct fl_coord {
    fl_ctx_t *ctx;
    fl_tp_sock_t *sock;
    fl_tp_sock_t *cmd_rx;
    fl_tp_sock_t *cmd_tx;
    char endpoint[FL_ENDPOINT_MAX];
    char job_id[FL_JOB_MAX];
    int world;
    int hb_ms;
    int hb_timeout_ms;
    int rdv_timeout_ms;
    uint64_t generation;
    fl_service_t svc; /* the coordinator thread and the job's outcome (fl_coord_wait) */

    /* parameter server (coordinator thread only) */
    int nshards;
    uint64_t init_params;    /* from the options (an --init file), 0 when not given */
    coord_server_t *servers; /* nshards slots, by the first shard served; liveness index
                                world + slot */
    int shards_covered;
    _Atomic int nservers_active;
    bool ps_lost; /* a server died or left mid-job: members wait for its successor, so
                     registrations are ignored rather than refused */

    /* coordinator thread only */
    coord_rank_t *ranks;
    fl_tp_live_t *live;
    coord_phase_t phase;
    int64_t started_ms;
    int nleft;
    int ndead;
    int64_t last_hb_ms;
    int stall_ms;
    bool ran;               /* the rendezvous completed (the job started) */
    int64_t last_stall_ms;  /* when the last stall report was written */
    fl_ratelimit_t warn_rl; /* warnings about peers' messages (fl_coord_warn) */

    /* shared with fl_coord_registered and the like */
    _Atomic int nregistered;
    _Atomic int nactive;  /* registered, not left, not dead */
    _Atomic int nunheard; /* ranks no registration came for (coord_rank_t.heard) */
    /* published by the coordinator thread at every tick, for fl_coord_get_info */
    pthread_mutex_t lock;
    fl_coord_info_t info;
    fl_coord_rank_info_t *rank_info;
};

/* FL_OK when rank r's registration agrees with the ranks already registered (model signature,
 * collective settings, declared settings); FL_EINVAL with both ranks and values in why
 * (coord_agree.c). */
int fl_coord_check_agree(const fl_coord_t *c, int r, const fl_msg_register_t *reg, char *why,
                         size_t cap);

/* Writes a stall report when a collective has made no progress for stall_ms: every rank's
 * collective, step, whom it waits for and when it was last heard from (coord_stall.c). */
void fl_coord_stall_check(fl_coord_t *c, int64_t now);

/* Describes what a rank was doing, from its last heartbeat (coord_tick.c). */
void fl_coord_describe_op(const coord_rank_t *k, char *out, size_t cap);

/* Publishes what fl_coord_get_info returns (coordinator thread). */
void fl_coord_publish(fl_coord_t *c, int64_t now);

/* Handles one message from the ROUTER socket (coord_handle.c). */
void fl_coord_on_message(fl_coord_t *c, fl_tp_msg_t *m);

/* Answers a refused message (rc FL_EPROTO from the transport) where the sender can be told. */
void fl_coord_on_refused(fl_coord_t *c, fl_tp_msg_t *m);

/* Periodic work: heartbeats, liveness, rendezvous deadline (coord_tick.c). */
void fl_coord_tick(fl_coord_t *c, int64_t now);

/* A warning about what a peer sent (a refused message or registration), rate-limited: the
 * first FL_COORD_WARN_BURST of each FL_COORD_WARN_WINDOW_MS pass, then one summary line with
 * the count held back and the bad messages by kind. */
#define FL_COORD_WARN_BURST 10
#define FL_COORD_WARN_WINDOW_MS 10000
void fl_coord_warn(fl_coord_t *c, const char *fmt, ...) FL_PRINTF(2, 3);

/* For the periodic tick: the summary line of the warnings held back in a window that has
 * ended, if any. */
void fl_coord_warn_flush(fl_coord_t *c, int64_t now);

/* A member's new token: 16 random bytes in hex (coord.c). A member that registers again for an
 * identity it holds proves it with this token; host and pid prove nothing (anyone on the host
 * can read them). */
void fl_coord_token_new(fl_coord_t *c, char token[FL_MSG_TOKEN_MAX]);

/* True when `given` is the token `held` (compared in constant time); never for an empty one. */
bool fl_coord_token_ok(const char *held, const char *given);

/* With per-member CURVE keys: whether m's key may register what m claims (a key bound to a
 * rank registers that rank, one bound to the server role a parameter-server process, the
 * job's shared key anything). False after refusing it, counted as auth_refused. */
bool fl_coord_key_fits(fl_coord_t *c, const fl_tp_msg_t *m);

/* Sends an error to a route and counts it. */
void fl_coord_send_error(fl_coord_t *c, const fl_tp_route_t *to, int code, int about,
                         const char *host, const char *fmt, ...) FL_PRINTF(6, 7);

/* Sends h to every member still there: the ranks registered, not gone and not declared dead,
 * and the servers (without waiting on any). */
void fl_coord_send_all(fl_coord_t *c, fl_msg_hdr_t *h);

/* Sends a refusal to a peer whose identity is not proven: an error like fl_coord_send_error,
 * but without the job's generation, which only members learn (with their welcome). host is
 * the asker's own, or "". */
void fl_coord_send_refusal(fl_coord_t *c, const fl_tp_route_t *to, int code, int about,
                           const char *host, const char *fmt, ...) FL_PRINTF(6, 7);

/* Refuses a registration (of a rank, or of a server with about -1): the asker hears why, and
 * the coordinator's log says it too (at warn, rate-limited), with both sides' values as the
 * text gives them. */
void fl_coord_refuse(fl_coord_t *c, const fl_tp_route_t *to, int about, const char *host,
                     const char *fmt, ...) FL_PRINTF(5, 6);

/* Marks the job finished with rc and text, waking fl_coord_wait (takes the lock). */
void fl_coord_finish(fl_coord_t *c, int rc, const char *text);

/* Ends a rendezvous that cannot succeed: every registered member is told why (an error),
 * and the job finishes with FL_EINVAL. */
void fl_coord_fail_rendezvous(fl_coord_t *c, const char *why);

/* The rendezvous failed: every registered rank (and `also`, a newcomer that is not, when not
 * NULL) and the servers hear why with `code`, and the job ends with `rc`. */
void fl_coord_fail_rendezvous_all(fl_coord_t *c, int rc, int code, int about, const char *host,
                                  const char *text, const fl_tp_route_t *also);

/* Tells every other rank and the servers that the job failed because of `about`, and ends
 * the job with that reason (a death, or a rank's own error). */
void fl_coord_fail_job(fl_coord_t *c, int about, const char *text);

/* Sends the welcome to every member once all ranks and shards are registered. */
void fl_coord_maybe_start(fl_coord_t *c);

/* Sends the welcome again to one member that asks for it (the job runs). */
void fl_coord_welcome_again(fl_coord_t *c, const fl_tp_route_t *to);

/* True when two routes are the same peer. */
bool fl_coord_same_route(const fl_tp_route_t *a, const fl_tp_route_t *b);

/* ---- the parameter server's side of the job (coord_ps.c) ---- */

/* A registration with the server role. */
void fl_coord_ps_on_register(fl_coord_t *c, fl_tp_msg_t *m);

/* The server slot a route belongs to, or -1. */
int fl_coord_ps_slot_of_route(const fl_coord_t *c, const fl_tp_route_t *route);

/* Heartbeats and goodbyes of a registered server. */
void fl_coord_ps_on_message(fl_coord_t *c, fl_tp_msg_t *m, int slot);

/* FL_OK when a worker's (or any member's) parameter count agrees with what the job knows;
 * otherwise FL_EINVAL and a text naming both sides in why. */
int fl_coord_ps_check_params(const fl_coord_t *c, uint64_t count, const char *who, char *why,
                             size_t cap);

/* FL_OK when reg's model agrees with that of every registered member (rank or server) that
 * described its tensors (Register.model_shapes) as reg did; otherwise FL_EINVAL, the member in
 * *other and a text naming the first tensor that differs, with both shapes, in why. A bare
 * signature is compared between ranks only (on_register): it may be a hash of another kind.
 * Callers fail the rendezvous when a rank and a server's --init differ, and refuse only the
 * newcomer when two ranks or two servers do. */
int fl_coord_check_model(const fl_coord_t *c, const fl_msg_register_t *reg,
                         const fl_msg_register_t **other, char *why, size_t cap);

/* True when every shard is served (always, without a parameter server). */
bool fl_coord_ps_complete(const fl_coord_t *c);

/* Fills the parameter-server part of a welcome (shard map, settings, resume step). FL_OK, or
 * FL_EINVAL with the reason the job cannot start in why (no parameter count, no checkpoint
 * step common to all shards). */
int fl_coord_ps_fill_welcome(fl_coord_t *c, fl_msg_hdr_t *h, char *why, size_t cap);

/* Sends h to every registered server still there. */
void fl_coord_ps_send_all(fl_coord_t *c, fl_msg_hdr_t *h);

/* Appends "shards 2..3" (those no server covers yet) to a list of missing members. */
void fl_coord_ps_missing(const fl_coord_t *c, char *out, size_t cap);

/* A server silent past the timeout (slot): forgotten during the rendezvous; afterwards the
 * job ends and every member is told the parameter server must restart. */
void fl_coord_ps_dead(fl_coord_t *c, int slot, int64_t silent_ms);

/* Frees the servers' tables. */
void fl_coord_ps_free(fl_coord_t *c);

#endif
