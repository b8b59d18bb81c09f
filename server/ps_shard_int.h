/* Private to the shard (ps_shard.c: lifecycle, thread, commands, checkpoints; ps_shard_msg.c:
 * pushes, pulls, replies). Everything here is touched by the shard's thread only, once it
 * runs; before that by the server that configures it. */
#ifndef FL_PS_SHARD_INT_H
#define FL_PS_SHARD_INT_H

#include <pthread.h>

#include "fl_cmp.h"
#include "fl_tp.h"
#include "ps_int.h"

/* A pull the consistency model does not allow yet. */
typedef struct ps_pending {
    fl_tp_route_t route;
    uint64_t seq; /* the request's, echoed in the answer */
    int rank;
    uint64_t step;
    bool latest;
    bool lz4;
    int64_t deadline;
    int64_t since;
} ps_pending_t;

/* lz4-encoded parameters of one version, piece by piece, shared by the replies that send
 * them; a piece lz4 does not shrink is sent raw (data[c] NULL). */
typedef struct ps_lz4 {
    _Atomic int refs;
    uint64_t version;
    int npieces;
    void *data[FL_MSG_MAX_FRAMES];
    size_t len[FL_MSG_MAX_FRAMES];
} ps_lz4_t;

struct ps_shard {
    fl_ctx_t *ctx; /* the server's (thread-safe: counters and ZeroMQ) */
    uint32_t index;
    char endpoint[FL_ENDPOINT_MAX];
    fl_tp_sock_t *sock;   /* ROUTER the ranks talk to */
    fl_tp_sock_t *cmd_rx; /* commands from the server */
    fl_tp_sock_t *cmd_tx;
    pthread_t thread;
    _Atomic bool started;

    /* configuration (fl_ps__shard_configure) */
    bool configured;
    ps_shard_conf_t conf;
    ps_state_t *state;
    fl_cmp_ws_t *ws;

    /* thread state */
    fl_tp_msg_t *rx; /* where the next message is received (a held push keeps it) */
    ps_pending_t *pending;
    size_t npending, pending_cap;
    fl_tp_route_t *routes; /* the connection each rank uses, once seen */
    bool *route_known;
    ps_lz4_t *lz4;                /* encoded parameters of the current version, or NULL */
    uint64_t ckpt_due;            /* step to checkpoint once completed (0: none); rank 0 asks */
    char failed[FL_MSG_TEXT_MAX]; /* the job failed: every request gets this */
    int failed_code;
    int64_t last_ckpt_ms;
    uint64_t reply_seq; /* the sequence number of the request being answered */

    /* counters (atomics: read by the server while the thread runs) */
    _Atomic uint64_t n_push, n_pull, n_refused, n_ckpt, n_timeouts;
};

/* Drops a reference to encoded parameters (a reply's release hook; any thread). */
void fl_ps__lz4_release(void *data, void *hint);

/* Handles one message from the ROUTER (ps_shard_msg.c); takes ownership of shard->rx when it
 * keeps the message (a held sync push). */
void fl_ps__shard_on_message(ps_shard_t *sh);

/* Answers a message the transport refused (bad header, job, generation, frames). */
void fl_ps__shard_on_refused(ps_shard_t *sh);

/* Answers the pending pulls that became possible, and those past their deadline. */
void fl_ps__shard_serve_pending(ps_shard_t *sh, int64_t now);

/* Fails every pending pull with the shard's failure text. */
void fl_ps__shard_fail_pending(ps_shard_t *sh);

/* The earliest deadline of a pending pull (INT64_MAX: none). */
int64_t fl_ps__shard_next_deadline(const ps_shard_t *sh);

/* Writes the shard's checkpoint labelled step, then removes all but the newest `keep`
 * (ps_shard.c). */
int fl_ps__shard_checkpoint(ps_shard_t *sh, uint64_t step);

/* Sends an error reply to route and counts it. */
void fl_ps__shard_error(ps_shard_t *sh, const fl_tp_route_t *to, int code, int about,
                        const char *fmt, ...) FL_PRINTF(5, 6);

/* "rank 3 (host-a)" */
const char *fl_ps__shard_rank_name(const ps_shard_t *sh, int rank, char *buf, size_t cap);

#endif
