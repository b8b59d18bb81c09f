/* Private to server/: the coordinator's state, shared by coord.c (lifecycle, thread, waiting)
 * and coord_handle.c (messages, liveness). All of it is touched by the coordinator thread
 * only, except the fields under `lock`. */
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
    fl_msg_register_t reg;
    /* last heartbeat's view of what the rank was doing */
    uint32_t op;
    uint64_t op_seq;
    uint32_t op_step;
    int32_t waiting_on;
} coord_rank_t;

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
    pthread_t thread;
    bool started;

    /* coordinator thread only */
    coord_rank_t *ranks;
    fl_tp_live_t *live;
    coord_phase_t phase;
    int64_t started_ms;
    int nleft;
    int ndead;
    int64_t last_hb_ms;

    /* shared with fl_coord_wait / fl_coord_registered */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool finished;
    int result;
    char result_text[1024];
    _Atomic int nregistered;
    _Atomic int nactive; /* registered, not left, not dead */
};

/* Handles one message from the ROUTER socket (coord_handle.c). */
void fl_coord_on_message(fl_coord_t *c, fl_tp_msg_t *m);

/* Answers a refused message (rc FL_EPROTO from the transport) where the sender can be told. */
void fl_coord_on_refused(fl_coord_t *c, fl_tp_msg_t *m);

/* Periodic work: heartbeats, liveness, rendezvous deadline (coord_handle.c). */
void fl_coord_tick(fl_coord_t *c, int64_t now);

/* Sends an error to a route and counts it. */
void fl_coord_send_error(fl_coord_t *c, const fl_tp_route_t *to, int code, int about,
                         const char *host, const char *fmt, ...) FL_PRINTF(6, 7);

/* Marks the job finished with rc and text, waking fl_coord_wait (takes the lock). */
void fl_coord_finish(fl_coord_t *c, int rc, const char *text);

#endif
