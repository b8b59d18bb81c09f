/* flodl coordinator: rendezvous, peer table, barrier and heartbeats of one job. flodl-ps runs it;
 * a program may embed it instead (one rank hosts it, as torchrun's store does). */
#ifndef FLODL_COORDINATOR_H
#define FLODL_COORDINATOR_H

#include <stdbool.h>
#include <stdint.h>

#include <flodl/flodl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_coord fl_coord_t;

typedef struct fl_coord_opts {
    size_t struct_size;        /* sizeof(fl_coord_opts_t), set by fl_coord_opts_init (as
                                  fl_comm_opts_t.struct_size) */
    const char *bind;          /* endpoint to bind, e.g. "tcp://0.0.0.0:29500" (required) */
    int world_size;            /* ranks expected (required, >= 1) */
    const char *job_id;        /* ranks with another job id are refused; default "flodl" */
    int heartbeat_ms;          /* heartbeat period both ways (default timeout / 5) */
    int heartbeat_timeout_ms;  /* a rank silent this long is declared dead (default 5000) */
    int rendezvous_timeout_ms; /* all ranks must register within this (default 300000) */
    fl_log_level_t log_level;  /* default FL_LOG_INFO */
    int num_shards;            /* parameter-server shards of the job, served by flodl-ps
                                  processes that register with this coordinator; the job
                                  starts once every shard is served (default 0: none) */
    const char *curve_dir;     /* CurveZMQ keys (see fl_comm_opts_t.curve_dir); NULL: plain */
    int stall_report_ms;       /* a collective that makes no progress this long gets a report
                                  of every rank's state in the log, repeated at this period
                                  while it lasts (default 60000; 0: never) */
    uint64_t param_count;      /* parameters the parameter server holds, when known up front
                                  (an --init file); 0 (default): workers and servers tell.
                                  Every member that tells must agree. */
} fl_coord_opts_t;

/* Defaults for every field; bind NULL and world_size 0 must be set by the caller. */
void fl_coord_opts_init(fl_coord_opts_t *opts);

/* Validates opts and binds. Returns FL_OK and *out, FL_EINVAL naming the field, FL_EIO when the
 * endpoint cannot be bound. */
int fl_coord_create(const fl_coord_opts_t *opts, fl_coord_t **out);

/* The endpoint actually bound (port chosen when bind asked for port 0). Owned by coord. */
const char *fl_coord_endpoint(const fl_coord_t *coord);

/* Starts the coordinator's thread. FL_OK or FL_EIO. */
int fl_coord_start(fl_coord_t *coord);

/* Waits until the job ends or timeout_ms passes (-1: no limit). Returns FL_OK when every rank
 * left cleanly (parameter-server processes are then told the job is over), FL_EPEER when a rank
 * died or the rendezvous failed (detail says which), FL_ETIMEDOUT when the job is still running. */
int fl_coord_wait(fl_coord_t *coord, int timeout_ms);

/* What the coordinator knows of the job, for metrics and stall reports: refreshed by its
 * thread every half heartbeat period. */
typedef enum fl_coord_rank_state {
    FL_COORD_RANK_ABSENT = 0, /* not registered (yet) */
    FL_COORD_RANK_ALIVE = 1,
    FL_COORD_RANK_DEAD = 2, /* silent past the heartbeat timeout */
    FL_COORD_RANK_LEFT = 3,
} fl_coord_rank_state_t;

typedef struct fl_coord_rank_info {
    fl_coord_rank_state_t state;
    char host[256];
    double silent_s; /* since its last message (alive ranks) */
    uint64_t op_seq; /* its collectives so far, as its heartbeats say */
    uint32_t op;     /* the collective in flight (0: none) */
} fl_coord_rank_info_t;

typedef struct fl_coord_info {
    int world;
    int registered;
    int alive;
    int dead;
    int left;
    bool started; /* the rendezvous completed */
    uint64_t generation;
    uint64_t bad_msgs;     /* messages refused (malformed, foreign job, out of place) */
    uint64_t auth_refused; /* connections refused by CURVE (a client key not allowed) */
} fl_coord_info_t;

/* How each rank ended, in one line for the log: "rank 0 done; rank 1 failed: <its error>;
 * rank 2 stopped after the job failed; rank 3 dead (...)", "never joined" or "still running".
 * After fl_coord_stop (reads the coordinator thread's state). */
void fl_coord_outcome(const fl_coord_t *coord, char *out, size_t cap);

/* Fills info and up to cap ranks' entries (ranks may be NULL). Thread-safe. */
void fl_coord_get_info(fl_coord_t *coord, fl_coord_info_t *info, fl_coord_rank_info_t *ranks,
                       int cap);

/* Stops the thread (joins it). Safe to call twice. */
void fl_coord_stop(fl_coord_t *coord);

/* Frees the coordinator; only after fl_coord_stop. NULL-safe; sets *coord to NULL. */
void fl_coord_destroy(fl_coord_t **coord);

#ifdef __cplusplus
}
#endif

#endif
