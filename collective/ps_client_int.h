/* Private to the parameter-server client (ps_client.c: lifecycle, the shard map, events and
 * resynchronisation; ps_client_io.c: pushes and pulls). One thread at a time uses a client. */
#ifndef FL_PS_CLIENT_INT_H
#define FL_PS_CLIENT_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include <flodl/ps.h>

#include "fl_cmp.h"
#include "fl_tp.h"
#include "release.h"

typedef struct cl_shard {
    uint32_t index;
    uint64_t offset;
    uint64_t count;
    char endpoint[FL_ENDPOINT_MAX];
    char host[FL_HOST_MAX];
    fl_tp_sock_t *sock; /* DEALER; NULL for an empty shard */
    void *stage;        /* what a push sends when it is not the caller's memory */
    size_t stage_cap;
    uint32_t *rel_idx; /* sparse pushes: indices relative to the shard */
    size_t rel_cap;
} cl_shard_t;

struct fl_ps_client {
    fl_ps_client_opts_t o;
    char coordinator[FL_ENDPOINT_MAX];
    char job_id[FL_JOB_MAX];
    char host[FL_HOST_MAX];
    fl_ctx_t *ctx;
    fl_tp_member_t *member;
    fl_tp_sock_t *events;   /* owned by member */
    fl_tp_status_t *status; /* owned by member: the push or pull in flight, for heartbeats */

    /* from the (latest) welcome */
    uint64_t generation;
    uint64_t n;
    fl_ps_consistency_t consistency;
    uint32_t staleness;
    uint64_t ckpt_every_steps;
    uint64_t ckpt_every_ms;
    int nshards;
    cl_shard_t *shards;

    uint64_t step;
    uint64_t seq;        /* request numbers; shards echo them */
    bool lost;           /* the coordinator went away; waiting for its successor */
    bool resync_pending; /* rejoined; the next pull joins again (init) */
    int broken_rc;       /* a fatal failure: every later call returns FL_ECLOSED */
    char broken_text[1024];
    bool aborted; /* fl_ps_client_abort: the worker stops on its own error */
    int abort_rc;
    char abort_text[768];
    int64_t last_mark_ms; /* rank 0: when it last asked for a checkpoint */
    fl_rel_t inflight;    /* zero-copy sends ZeroMQ still holds */
    fl_cmp_ws_t *ws;

    fl_ps_client_stats_t stats;

    /* A part (fl_ps_client_split): parent set; ctx, status and the shard connections of
     * shards[0..nshards) (a slice of the parent's) are borrowed; no membership, no events. */
    fl_ps_client_t *parent;
    int part;        /* its index among the parent's parts */
    uint64_t lo, hi; /* the keys its shards hold: [lo, hi) */
    /* The parent of parts: the checkpoint mark of a step, decided by the first part there
     * so that every part (and so every shard) marks the same step. */
    pthread_mutex_t mark_mu;
    bool have_mark_mu;
    uint64_t mark_step;
    bool mark_val;
    _Atomic int nparts;     /* parts alive */
    _Atomic int parts_stop; /* set (after stop_rc and stop_text) when the parts must stop */
    int stop_rc;
    char stop_text[1024];
};

/* Opens one DEALER per non-empty shard of the current map, stamped with the generation. */
int fl_psc__connect_shards(fl_ps_client_t *cl);

/* Closes the shard connections (dropping whatever is queued on them, so ZeroMQ lets go of
 * the caller's memory and late answers of a failed exchange never arrive) and opens new ones. */
int fl_psc__reset_shards(fl_ps_client_t *cl);

/* Takes the shard map and settings of a welcome (first one, or after a rejoin). */
int fl_psc__take_welcome(fl_ps_client_t *cl, fl_msg_hdr_t *h);

/* Handles one event of the membership: FL_OK (nothing for the caller), FL_ERESYNC (rejoined:
 * the shard map was replaced, the caller joins again), or a fatal error that breaks the
 * client. */
int fl_psc__on_event(fl_ps_client_t *cl);

/* Waits (bounded by the reconnect deadline the membership applies) until the client rejoins
 * a restarted coordinator: FL_ERESYNC, or the fatal error. */
int fl_psc__wait_rejoin(fl_ps_client_t *cl);

/* Marks the client broken with rc and the current detail text. Returns rc. */
int fl_psc__break(fl_ps_client_t *cl, int rc);

/* Rank 0's checkpoint mark for the push of the client's step (a part asks its parent). */
bool fl_psc__checkpoint_mark(fl_ps_client_t *cl);

/* One exchange with every non-empty shard (ps_client_io.c): an optional push (grad, or rank
 * 0's initial parameters when init is set) and an optional pull into params (latest: whatever
 * the shards hold once they have parameters). Returns FL_OK, FL_ERESYNC, or the failure. */
int fl_psc__exchange(fl_ps_client_t *cl, const fl_ps_grad_t *grad, bool init, float *params,
                     bool latest);

#endif
