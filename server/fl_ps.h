/* server: flodl-ps. The coordinator (rendezvous, peer table, heartbeats, failure broadcast)
 * whose public face is include/flodl/coordinator.h; the parameter-server shards join it.
 * This header holds what tests and the binary need beyond the public API. */
#ifndef FL_PS_H
#define FL_PS_H

#include <flodl/coordinator.h>
#include <flodl/ps.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A counter of the coordinator's context (bad messages refused, errors sent, ...). */
uint64_t fl_coord_stat(const fl_coord_t *coord, fl_stat_t stat);

/* Ranks registered so far (thread-safe). */
int fl_coord_registered(const fl_coord_t *coord);

/* Ranks registered that have neither left nor been declared dead (thread-safe). */
int fl_coord_active(const fl_coord_t *coord);

/* Ranks never heard from: no registration, accepted or refused, came for them. After a failed
 * rendezvous flodl-ps stays a while to tell them why instead of leaving them to wait out their
 * rendezvous timeout (thread-safe). */
int fl_coord_unheard(const fl_coord_t *coord);

/* Parameter-server processes registered that have neither left nor been declared dead. */
int fl_coord_servers_active(const fl_coord_t *coord);

/* The bound on bytes held for messages not yet complete over the coordinator's sockets
 * (fl_ctx_set_held_max; flodl-ps's --held-max). FL_OK or FL_EINVAL. Thread-safe. */
int fl_coord_set_held_max(fl_coord_t *coord, size_t bytes);

/* Largest control message accepted, in bytes (frames up to twice this are refused with an
 * answer; larger ones make ZeroMQ drop the connection). */
#define FL_COORD_MAX_MSG ((size_t)1 << 20)

/* ---- the shard map (ps_map.c) ---- */

/* Shard boundaries fall on multiples of this many parameters (64 bytes of float32). */
#define FL_PS_ALIGN 16

typedef struct fl_ps_range {
    uint64_t offset;
    uint64_t count; /* 0: an empty shard */
} fl_ps_range_t;

/* Key range `index` of n parameters cut into nshards contiguous ranges balanced by bytes:
 * boundaries on multiples of FL_PS_ALIGN, sizes differing by at most FL_PS_ALIGN, ranges in
 * index order covering 0..n-1 exactly once (with fewer than nshards blocks of FL_PS_ALIGN
 * some ranges are empty). An index out of range gives an empty range at 0. */
void fl_ps_map_range(uint64_t n, uint32_t nshards, uint32_t index, fl_ps_range_t *out);

/* ---- a parameter-server process's shards (ps_server.c) ---- */

typedef struct fl_ps_server fl_ps_server_t;

typedef struct fl_ps_server_opts {
    const char *coordinator;         /* the job's coordinator (required) */
    const char *job_id;              /* default "flodl" */
    const char *curve_dir;           /* CurveZMQ keys (see fl_comm_opts_t); NULL: plain */
    const char *host;                /* the address ranks dial (NULL: the local address of the
                                        route to the coordinator) */
    const char *bind_host;           /* interface the shards listen on (NULL: host when it is
                                        an IPv4 address, else every interface) */
    int num_shards;                  /* shards of the job (default 1) */
    int shard_first;                 /* the first one this process serves (default 0) */
    int shard_count;                 /* how many it serves (default 1), each with its thread */
    fl_ps_consistency_t consistency; /* default sync */
    uint32_t staleness;              /* ssp only */
    double async_scale;              /* async and ssp: factor on each push (0: 1 / world) */
    fl_opt_opts_t opt;               /* the server-side optimizer (default plain SGD) */
    fl_lr_sched_t lr;                /* its learning-rate schedule (default 0.01, constant) */
    const char *init_path;           /* initial parameters (safetensors, float32 tensors in
                                        file order = the flat vector); NULL: rank 0's */
    const char *checkpoint_dir;      /* NULL: no checkpoints */
    uint64_t ckpt_every_steps;       /* rank 0 asks for a checkpoint every so many steps */
    uint64_t ckpt_every_ms;          /* ... or every so many milliseconds */
    int keep;                        /* checkpoints kept per shard (default 3) */
    bool resume;                     /* start from the newest checkpoint every shard holds */
    int max_wait_ms;                 /* the longest a pull is held (default 3600000) */
    int rendezvous_timeout_ms;       /* default 300000 */
    fl_log_level_t log_level;        /* default info */
    bool tune_malloc;                /* default true: fl_malloc_tune() for the pushes' buffers */
    size_t held_max_bytes;           /* bound on bytes held for messages not yet complete over
                                        the shards' sockets (fl_ctx_opts_t.held_max_bytes; 0:
                                        its default) */
} fl_ps_server_opts_t;

/* A server's Register.model_shapes starts with an entry naming its --init file: this tag, the
 * path and ';'. It is not part of the signature; the coordinator names the file with it. */
#define FL_PS_INIT_FILE_TAG "file:"

/* Checks an --init file as fl_ps_server_create does (float32 tensors, every value finite, not
 * empty) without touching the network, so that flodl-ps refuses a bad one before it binds or
 * connects anything. FL_OK, or FL_EINVAL naming the file and, for a NaN or Inf, the tensor and
 * its index. Thread-safe. */
int fl_ps_server_check_init(const char *path);

void fl_ps_server_opts_init(fl_ps_server_opts_t *opts);

/* Checks the options, reads the --init file's layout and, when resuming, which checkpoint
 * steps every shard holds (refusing a directory of another run without --resume), and binds
 * the shards' sockets. FL_OK and *out; FL_EINVAL naming the flag or file; FL_EPROTO for an
 * unreadable --init; FL_EIO. */
int fl_ps_server_create(const fl_ps_server_opts_t *opts, fl_ps_server_t **out);

/* The parameter count known before the rendezvous (--init or checkpoints), else 0. */
uint64_t fl_ps_server_param_count(const fl_ps_server_t *srv);

/* The endpoint of the k-th shard this process serves. */
const char *fl_ps_server_endpoint(const fl_ps_server_t *srv, int k);

/* Starts serving in a thread: registers, waits for the rendezvous, loads the shards' initial
 * parameters, serves until the job ends. FL_OK or FL_EIO. */
int fl_ps_server_start(fl_ps_server_t *srv);

/* Waits until the server is done or timeout_ms passes (-1: no limit). FL_OK when the job ended
 * cleanly; the failure otherwise (a rank died, the coordinator was lost, the rendezvous
 * failed: the detail says which); FL_ETIMEDOUT while it still serves. */
int fl_ps_server_wait(fl_ps_server_t *srv, int timeout_ms);

/* Stops serving (a final checkpoint when checkpoints are on) and leaves the job. */
void fl_ps_server_stop(fl_ps_server_t *srv);

void fl_ps_server_destroy(fl_ps_server_t **srv);

typedef struct fl_ps_server_stats {
    uint64_t pushes;       /* pushes taken by its shards */
    uint64_t pulls;        /* replies sent */
    uint64_t refused;      /* error replies: bad or out-of-place requests */
    uint64_t bad_msgs;     /* messages the transport refused (malformed, wrong job, ...) */
    uint64_t auth_refused; /* connections refused by CURVE (a client key not allowed) */
    uint64_t conn_dropped; /* connections closed in their handshake, over the caps on those */
    uint64_t checkpoints;  /* shard checkpoints written */
    uint64_t timeouts;     /* pulls that waited past their deadline */
    uint64_t version;      /* after stop: updates applied (the largest over its shards) */
    uint64_t step;         /* after stop: steps completed by the slowest rank (smallest) */
} fl_ps_server_stats_t;

void fl_ps_server_get_stats(const fl_ps_server_t *srv, fl_ps_server_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif
