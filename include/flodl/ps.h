/* flodl parameter-server client: a rank pushes gradients to the shards of flodl-ps and pulls
 * parameters back. The coordinator hands every rank the shard map at rendezvous; each shard
 * (a key range of the flat float32 parameter vector) is served by its own thread, so a push or
 * a pull is split per shard and the shards work in parallel. The server holds the parameters
 * and the optimizer state (SGD with momentum / Nesterov / weight decay, Adam, AdamW, with a
 * learning-rate schedule), and applies the updates under one of three consistency models:
 *
 *   FL_PS_SYNC   bulk synchronous: for step t every shard waits for all W ranks' pushes,
 *                averages them weighted by their batch counts, applies the optimizer once, and
 *                answers pulls for step t + 1 with the new parameters. Every rank computes on
 *                the same parameters, as with an allreduce.
 *   FL_PS_ASYNC  every push is applied when it arrives (scaled by 1/W by default); a pull
 *                returns the latest parameters at once. No rank ever waits for another.
 *   FL_PS_SSP    stale synchronous parallel: updates as async, but a rank about to compute
 *                step t gets parameters only once the slowest rank has completed step t - s
 *                (s: the staleness bound); a faster rank waits there.
 *
 * A rank's loop: fl_ps_client_init() once, then per step compute the gradient on the
 * parameters of fl_ps_client_step() and call fl_ps_client_push_pull(). One thread at a time per
 * client. */
#ifndef FLODL_PS_H
#define FLODL_PS_H

#include <stddef.h>
#include <stdint.h>

#include <flodl/flodl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fl_ps_consistency {
    FL_PS_SYNC = 0,
    FL_PS_ASYNC = 1,
    FL_PS_SSP = 2,
} fl_ps_consistency_t;

/* "sync", "async", "ssp"; "unknown" otherwise. */
const char *fl_ps_consistency_name(fl_ps_consistency_t c);

/* Parses "sync|bsp|async|ssp". FL_OK or FL_EINVAL. */
int fl_ps_consistency_parse(const char *s, fl_ps_consistency_t *out);

typedef struct fl_ps_client fl_ps_client_t;

typedef struct fl_ps_client_opts {
    size_t struct_size;        /* sizeof(fl_ps_client_opts_t), set by fl_ps_client_opts_init
                                  (as fl_comm_opts_t.struct_size) */
    int rank;                  /* this rank, 0 <= rank < world_size (required) */
    int world_size;            /* ranks of the job (required) */
    const char *coordinator;   /* the coordinator's endpoint, "tcp://host:port" (required) */
    const char *job_id;        /* default "flodl" */
    const char *curve_dir;     /* CurveZMQ keys (see fl_comm_opts_t.curve_dir); NULL: plain */
    const char *host;          /* how the job names this rank's host; NULL: the local address
                                  of the route to the coordinator */
    size_t param_count;        /* parameters of the model, flat float32 (required) */
    uint64_t model_signature;  /* ranks must agree (a hash of the shapes); 0: not checked */
    const char *settings;      /* what every rank must share (see fl_comm_opts_t.settings) */
    int timeout_ms;            /* deadline of one push or pull, waits included (default 300000) */
    int rendezvous_timeout_ms; /* deadline of the rendezvous (default 300000) */
    int reconnect_timeout_ms;  /* how long to wait for a restarted parameter server before
                                  failing (default 600000; 0: fail at once) */
    fl_dtype_t values;         /* gradient values on the wire: float32 (default), float16 or
                                  bfloat16 (dense and sparse pushes alike) */
    int lz4;                   /* lz4 dense pushes and pulled parameters when that shrinks
                                  them (default 0) */
    fl_log_level_t log_level;  /* default FL_LOG_WARN */
    int tune_malloc;           /* 1 (default): keep glibc from returning received parameters'
                                  buffers to the kernel after each pull (as fl_comm_opts_t) */
    const char *model_shapes;  /* NULL, or the model's tensors in the flat vector's order, a
                                  line "name[d0,d1]" each, no spaces (for an MLP
                                  "layers.0.weight[256,64]\nlayers.0.bias[256]\n..."): the
                                  signature sent is then its hash, not model_signature, and
                                  the coordinator checks it against flodl-ps --init's
                                  tensors, naming the first one that differs (read during
                                  fl_ps_client_create only) */
} fl_ps_client_opts_t;

/* Defaults for every field; rank, world_size, coordinator and param_count stay unset. */
void fl_ps_client_opts_init(fl_ps_client_opts_t *opts);

/* Fills rank, world size, coordinator, host, job id and log level from the environment a
 * launcher sets (as fl_comm_opts_from_env). FL_OK or FL_EINVAL naming the variable. */
int fl_ps_client_opts_from_env(fl_ps_client_opts_t *opts);

/* Registers with the coordinator, waits for the rendezvous and connects to every shard.
 * FL_OK and *out; FL_EINVAL (a bad option, or refused: another model, parameter count or
 * world size than the job's, no parameter server in the job), FL_ETIMEDOUT, FL_EIO. */
int fl_ps_client_create(const fl_ps_client_opts_t *opts, fl_ps_client_t **out);

/* Leaves the job and frees. NULL-safe; sets *client to NULL. */
void fl_ps_client_destroy(fl_ps_client_t **client);

/* As fl_comm_abort: this worker stops on its own error; fl_ps_client_destroy then leaves the
 * job with it, and the coordinator tells the others at once. */
void fl_ps_client_abort(fl_ps_client_t *client, int code, const char *why);

/* The job's settings as the coordinator gave them. */
size_t fl_ps_client_param_count(const fl_ps_client_t *client);
int fl_ps_client_num_shards(const fl_ps_client_t *client);
fl_ps_consistency_t fl_ps_client_consistency(const fl_ps_client_t *client);
int fl_ps_client_staleness(const fl_ps_client_t *client);

/* The step whose gradient the caller computes next (0-based). */
uint64_t fl_ps_client_step(const fl_ps_client_t *client);

/* Joins the training: rank 0 offers params as the initial parameters (taken by shards that
 * have none: no --init file, no checkpoint), then every rank waits until the shards hold
 * parameters and copies them into params (param_count floats). Sets the step to the
 * server's (0, or the step of the checkpoint it resumed from). Errors as
 * fl_ps_client_pull; waiting for rank 0 past the deadline names it. */
int fl_ps_client_init(fl_ps_client_t *client, float *params);

/* A gradient of the whole parameter vector: dense (param_count floats) or sparse (k pairs:
 * indices strictly ascending, each < param_count, and their values, e.g. from top-k with
 * error feedback), with the number of samples behind it (the weight of this rank in the
 * synchronous average; 0: this rank skips the step). */
typedef struct fl_ps_grad {
    const float *dense;  /* param_count floats, or NULL for a sparse gradient */
    const uint32_t *idx; /* sparse: k indices */
    const float *val;    /* sparse: k values */
    size_t k;
    uint32_t batch;
} fl_ps_grad_t;

/* Pushes the gradient of step fl_ps_client_step() to every shard and waits for them to take
 * it; the step then advances. Borrowed buffers: untouched, and free to reuse once the call
 * returns. FL_OK; FL_EINVAL (a bad gradient: NaN or Inf, indices out of order or range; or
 * refused by a shard, with its reason: a step out of order or beyond the staleness bound);
 * FL_ETIMEDOUT naming the shard; FL_EPEER (a rank died: the job is over); FL_ERESYNC (the
 * parameter server restarted from a checkpoint: pull the parameters (fl_ps_client_pull) and
 * go on from the restored fl_ps_client_step()); FL_ECLOSED after an earlier fatal error. */
int fl_ps_client_push(fl_ps_client_t *client, const fl_ps_grad_t *grad);

/* Copies into params (param_count floats) the parameters for computing step
 * fl_ps_client_step(), waiting as the consistency model requires (sync: until every rank's
 * push of the previous step is applied; ssp: until the slowest rank is within the staleness
 * bound; async: not at all). A wait past the deadline fails with FL_ETIMEDOUT naming the rank
 * the shard was waiting for. FL_ERESYNC: the server restarted; params hold its restored
 * parameters and the step was reset to its step. Other errors as fl_ps_client_push. */
int fl_ps_client_pull(fl_ps_client_t *client, float *params);

/* fl_ps_client_push then fl_ps_client_pull in one round trip per shard. When every shard took
 * the push but the pull failed (a wait past the deadline), the step has advanced
 * (fl_ps_client_step says so): retry with fl_ps_client_pull. A push that failed before every
 * shard took it may be retried as it is: shards that took it already acknowledge the repeat
 * and ignore it. A gradient holding NaN or Inf is refused (FL_ENONFINITE) before anything is
 * sent. */
int fl_ps_client_push_pull(fl_ps_client_t *client, const fl_ps_grad_t *grad, float *params);

/* Several devices per host: part `part` of `parts` is a client of its own over the
 * contiguous shards [part * S / parts, (part + 1) * S / parts) of the S shards (whole shards,
 * so every shard still hears one push per rank and step: the server counts ranks, not
 * devices), using this client's connections to them. Each part is driven by its own thread
 * (one thread at a time per part); push, pull and push_pull on a part send and receive its
 * keys only (a dense gradient or the params buffer is still the whole vector, indexed as
 * usual; a sparse gradient holds indices of its keys only). Every part starts at this
 * client's step: split after fl_ps_client_init, and while parts live do not use this client
 * itself. Part 0 must be driven by the thread that owns this client: it listens to the
 * coordinator for all parts. When the job fails, every part's call fails with the failure;
 * when the parameter server is lost, every part's call returns FL_ERESYNC (pushes of that call
 * may still be queued: the buffers they came from are free again once the part is destroyed,
 * which drops them): destroy the parts,
 * call fl_ps_client_pull on this client (it waits for the restarted server and joins it again:
 * FL_OK with its parameters and fl_ps_client_step restored) and split again. Destroy the
 * parts (fl_ps_client_destroy) before this client. FL_OK and *out; FL_EINVAL (parts outside 1..S,
 * or a part split again); FL_ECLOSED after a fatal error; FL_ENOMEM. */
int fl_ps_client_split(fl_ps_client_t *client, int part, int parts, fl_ps_client_t **out);

/* Part 0, while the other parts' calls run (its own is done): listens to the coordinator for
 * them, as its own calls do, for up to timeout_ms (0: only looks). FL_OK; or the failure, or
 * FL_ERESYNC, the parts were stopped with. Other clients: FL_OK at once. */
int fl_ps_client_part_listen(fl_ps_client_t *client, int timeout_ms);

/* The keys a part pushes and pulls, [*offset, *offset + *count) (a whole client: all). */
void fl_ps_client_part_range(const fl_ps_client_t *client, size_t *offset, size_t *count);

typedef struct fl_ps_client_stats {
    uint64_t pushes;     /* gradients pushed (whole vectors) */
    uint64_t pulls;      /* parameter vectors pulled */
    uint64_t bytes_sent; /* payload bytes sent to the shards */
    uint64_t bytes_recv; /* payload bytes received from them */
    uint64_t raw_bytes;  /* what dense float32 pushes would have sent */
    double wait_ms;      /* time spent in pushes and pulls */
    uint64_t resyncs;    /* restarts of the parameter server survived */
} fl_ps_client_stats_t;

void fl_ps_client_get_stats(const fl_ps_client_t *client, fl_ps_client_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif
