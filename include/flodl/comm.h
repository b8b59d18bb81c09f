/* flodl communicator: rendezvous through the coordinator (flodl-ps or an embedded fl_coord), and
 * collectives over ZeroMQ on TCP (or ipc://, inproc://) between the ranks of one job.
 * All ranks must call the same collectives in the same order with matching counts and types,
 * as with MPI or NCCL. A failed collective (dead peer, deadline, bad data) breaks the
 * communicator: later calls return FL_ECLOSED with the original cause, and the caller destroys it.
 */
#ifndef FLODL_COMM_H
#define FLODL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include <flodl/flodl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_comm fl_comm_t;

/* Which allreduce algorithm runs. AUTO picks one-shot up to 8 KiB (and small_bytes) when there
 * are at most 8 ranks, recursive doubling above that up to small_bytes, and the ring above
 * small_bytes. */
typedef enum fl_algo {
    FL_ALGO_AUTO = 0,
    FL_ALGO_RING = 1,   /* bandwidth-optimal: each rank sends 2(N-1)/N of the buffer */
    FL_ALGO_RD = 2,     /* recursive doubling: log2(N) rounds of the whole buffer */
    FL_ALGO_DIRECT = 3, /* one-shot: the whole buffer to every peer, one network hop */
} fl_algo_t;

typedef struct fl_comm_opts {
    size_t struct_size;        /* sizeof(fl_comm_opts_t) as the program was built, set by
                                  fl_comm_opts_init: the library refuses a size it does not
                                  know (FL_EINVAL); see "ABI" in flodl.h */
    int rank;                  /* this rank, 0 <= rank < world_size (required) */
    int world_size;            /* number of ranks in the job (required) */
    const char *coordinator;   /* coordinator endpoint "tcp://host:port" (required) */
    const char *job_id;        /* must match the coordinator's; default "flodl" */
    const char *host;          /* address peers reach this rank at; NULL: the local address of
                                  the route to the coordinator */
    const char *bind;          /* data endpoint; NULL: "tcp://<host>:0" (ephemeral port). Also
                                  "ipc:///path" or "inproc://name" (same process only) */
    int timeout_ms;            /* deadline of one collective call (default 300000) */
    int rendezvous_timeout_ms; /* deadline of the rendezvous in fl_comm_init (default 300000) */
    int stripes;               /* TCP connections per peer pair, 1..8 (default 1) */
    size_t segment_bytes;      /* pipelining unit of the ring (default 1 MiB) */
    size_t small_bytes;        /* AUTO uses a latency algorithm up to this size (default 128 KiB) */
    fl_algo_t algo;            /* force an algorithm (default FL_ALGO_AUTO) */
    fl_log_level_t log_level;  /* default FL_LOG_WARN */
    uint64_t model_signature;  /* ranks of one job must agree (e.g. a hash of the parameter
                                  shapes); the coordinator refuses a rank whose signature
                                  differs, naming both. 0 (default): not checked. */
    const char *settings;      /* what every rank of the job must share, as "name=value" pairs
                                  joined by ';' ("lr=0.05;batch=64"; names a-z 0-9 _ - ., at
                                  most 2047 bytes): the coordinator refuses the job at the
                                  rendezvous when two ranks differ, naming the setting and both
                                  values. NULL (default): nothing declared. */
    const char *curve_dir;     /* CurveZMQ keys: server.key, client.key and authorized/ with the
                                  allowed clients' .pub files (flodl-keygen makes them): every
                                  connection authenticated and encrypted. NULL (default): plain
                                  text. */
    int tune_malloc;           /* 1 (default): keep glibc from returning ZeroMQ's receive
                                  buffers to the kernel after every segment (sets the process's
                                  M_MMAP_THRESHOLD to 32 MiB and M_TRIM_THRESHOLD to 512 MiB;
                                  without it large allreduces run ~30% slower on page faults).
                                  0: leave the process's malloc settings alone. */
    int ipc;                   /* 1 (default): ranks on the same host (the same advertised
                                  address, or loopback on both) exchange data over ipc://
                                  sockets in a private directory of the job (/tmp/flodl-<uid>-
                                  <hash>, mode 0700, removed when the last rank leaves),
                                  CURVE-secured like TCP; only with a tcp data endpoint.
                                  Members of its sub-communicators (fl_comm_split) bind and
                                  dial ipc the same way. 0: TCP between all ranks and members
                                  (FLODL_IPC=0, --ipc 0). */
} fl_comm_opts_t;

/* Fills every field with its default; rank, world_size and coordinator stay unset (-1/NULL). */
void fl_comm_opts_init(fl_comm_opts_t *opts);

/* Fills rank, world size, coordinator, host and log level from the environment a launcher sets:
 * FLODL_RANK / FLODL_WORLD_SIZE / FLODL_COORDINATOR / FLODL_HOST / FLODL_JOB_ID / FLODL_LOG /
 * FLODL_IPC (1 or 0: same-host data over ipc://);
 * torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; Open MPI's OMPI_COMM_WORLD_RANK /
 * OMPI_COMM_WORLD_SIZE; Kubernetes' JOB_COMPLETION_INDEX. Fields the environment does not set
 * are left as they are. Strings point into the environment and live as long as it does.
 * Returns FL_OK, or FL_EINVAL naming the variable that does not parse. Not thread-safe with
 * setenv. */
int fl_comm_opts_from_env(fl_comm_opts_t *opts);

/* Registers with the coordinator, waits for all world_size ranks (until rendezvous_timeout_ms),
 * and connects to the peers. Returns FL_OK and *out, or FL_EINVAL (bad option, or refused by the
 * coordinator: duplicate rank, world size / version / job mismatch), FL_ETIMEDOUT (rendezvous
 * did not complete; the detail lists the missing ranks when the coordinator told us), FL_EIO. */
int fl_comm_init(const fl_comm_opts_t *opts, fl_comm_t **out);

/* Leaves the job and frees everything. Waits (bounded by timeout_ms) for this rank's queued
 * sends to leave. NULL-safe; sets *comm to NULL. */
void fl_comm_destroy(fl_comm_t **comm);

/* Says that this rank stops on an error of its own (code, a negative fl_err_t; why, the
 * detail): it leaves the job "with an error" at once (not at fl_comm_destroy, so that freeing
 * a hung device or waiting for a stuck thread does not delay it), and the coordinator tells the
 * other ranks, naming this rank and why, instead of letting them wait for it until their
 * deadline. Later collectives return FL_ECLOSED. One thread at a time per comm: no other
 * thread may be in a call on comm or on its sub-communicators. */
void fl_comm_abort(fl_comm_t *comm, int code, const char *why);

int fl_comm_rank(const fl_comm_t *comm);
int fl_comm_size(const fl_comm_t *comm);

/* The host a peer registered with; owned by the communicator. NULL for a bad rank. */
const char *fl_comm_peer_host(const fl_comm_t *comm, int rank);

/* Shard layout used by reduce-scatter and all-gather: count elements split into nshards
 * contiguous ranges, the first (count % nshards) shards one element longer. */
size_t fl_shard_offset(size_t count, int nshards, int index);
size_t fl_shard_count(size_t count, int nshards, int index);

/* Buffers may be host memory or CUDA device memory (staged through host memory; the calls
 * return once the device buffers hold the result). */

/* Every rank ends with op applied elementwise over all ranks' sendbuf, in recvbuf.
 * sendbuf == recvbuf is allowed (in place; partial overlap is refused with FL_EINVAL). Every
 * rank gets the same bytes. The buffers are
 * borrowed until the call returns. float16/bfloat16: float32 partial sums travel during the
 * reduction, rounded once to the dtype at the end. Returns FL_OK, FL_EINVAL (bad dtype/op),
 * FL_EPEER (a peer died: the detail names rank, host and the operation), FL_ETIMEDOUT (no data
 * from the named peer within timeout_ms), FL_EPROTO (a peer sent data that does not match),
 * FL_ECLOSED (communicator broken earlier). One thread at a time per communicator. */
int fl_allreduce(fl_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                 fl_dtype_t dtype, fl_op_t op);

/* sendbuf holds count elements on every rank; recvbuf receives this rank's shard of the
 * reduction: fl_shard_count(count, N, rank) elements starting at fl_shard_offset(...).
 * In place: recvbuf == sendbuf + that offset (as NCCL); buffers overlapping otherwise are
 * refused (FL_EINVAL). Errors as fl_allreduce. */
int fl_reduce_scatter(fl_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                      fl_dtype_t dtype, fl_op_t op);

/* Each rank contributes its shard (fl_shard_count(count, N, rank) elements at sendbuf) and every
 * rank receives all count elements in recvbuf, shard i at fl_shard_offset(count, N, i).
 * In place: sendbuf points at its own shard inside recvbuf; other overlaps are refused
 * (FL_EINVAL). Errors as fl_allreduce. */
int fl_allgather(fl_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                 fl_dtype_t dtype);

/* Copies root's buf to every rank's buf. Errors as fl_allreduce. */
int fl_broadcast(fl_comm_t *comm, void *buf, size_t count, fl_dtype_t dtype, int root);

/* Returns once every rank has entered the barrier. Errors as fl_allreduce. */
int fl_barrier(fl_comm_t *comm);

/* Sub-communicators, as MPI_Comm_split, with n members per rank (one per local device, each
 * driven by its own thread; n = 1 is MPI's split). Member t of this rank joins group colors[t]
 * (negative: none, out[t] = NULL), ordered by keys[t] (NULL: all 0), ties broken by parent
 * rank then t. Collective over comm: every rank calls it with the same n. Each member has its
 * own data connections (so members move data in parallel; over ipc:// to members on the same
 * host when comm uses ipc, see fl_comm_opts_t.ipc), the parent's job, deadlines and
 * tuning, and fails at once with the parent's failure events (a dead peer, a lost
 * coordinator). A member is used by one thread at a time, independently of the others and of
 * comm, and is destroyed with fl_comm_destroy before comm. Hosts in its error texts are the
 * parent's. FL_OK and out[0..n); FL_EINVAL (n outside 1..64, or ranks asking for different
 * n: the detail names them), or the parent's collective errors. */
int fl_comm_split(fl_comm_t *comm, int n, const int *colors, const int *keys, fl_comm_t **out);

/* ---- sparse allreduce (top-k pairs, see compress.h) ---- */

typedef struct fl_sparse_opts {
    fl_dtype_t values; /* values on the wire: float32 (default), float16 or bfloat16 */
    int lz4;           /* lz4 the blocks when that shrinks them (default 1) */
    int allow_dense;   /* switch to the dense ring when the gathered pairs would outweigh it
                          (default 1) */
    size_t k_max;      /* the most pairs any rank sends, when every rank knows it (e.g. the same
                          density everywhere): saves the round that gathers every rank's k.
                          A rank with more pairs fails with FL_EINVAL. 0 (default): gathered. */
} fl_sparse_opts_t;

typedef struct fl_sparse_stats {
    int dense;           /* 1 when the dense ring ran instead of the sparse exchange */
    uint64_t k_total;    /* pairs contributed by all ranks (0 when k_max saved the gathering
                            and the dense path ran: then it is not known) */
    uint64_t raw_bytes;  /* what a dense ring allreduce of n float32 sends from this rank */
    uint64_t wire_bytes; /* what this rank actually sent */
    double ratio;        /* raw_bytes / wire_bytes */
} fl_sparse_stats_t;

void fl_sparse_opts_init(fl_sparse_opts_t *opts);

/* Sums sparse contributions: each rank gives k pairs (idx ascending, each < n; k may differ
 * between ranks) of the same float32 tensor of n entries, and every rank receives in out
 * (n floats) the sum (FL_SUM) or average (FL_AVG) of all ranks' pairs, zeros elsewhere: the
 * same bytes on every rank. Values are rounded to opts->values before they travel (on every
 * rank alike, the sender's own pairs too). The encoded blocks go round the ring and each rank
 * adds them up in rank order; when N * k * bytes-per-pair would exceed the dense ring's
 * 2 * n * 4 bytes, it scatters its pairs and runs the dense ring instead (stats->dense).
 * opts and stats may be NULL. Errors as fl_allreduce, plus FL_EPROTO for a corrupt block
 * (naming the rank it came from). */
int fl_sparse_allreduce(fl_comm_t *comm, const uint32_t *idx, const float *val, size_t k,
                        float *out, size_t n, fl_op_t op, const fl_sparse_opts_t *opts,
                        fl_sparse_stats_t *stats);

typedef struct fl_comm_stats {
    uint64_t ops;               /* collectives completed */
    uint64_t bytes_sent;        /* payload bytes this rank sent */
    uint64_t bytes_sent_remote; /* of which to ranks on another host (another host address:
                                   what crosses the network between hosts) */
    uint64_t bytes_recv;        /* payload bytes this rank received */
    uint64_t bad_msgs;          /* messages refused (malformed, wrong job, out of place) */
    fl_algo_t last_algo;        /* algorithm of the last allreduce */
} fl_comm_stats_t;

/* Counters since fl_comm_init. */
void fl_comm_get_stats(const fl_comm_t *comm, fl_comm_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif
