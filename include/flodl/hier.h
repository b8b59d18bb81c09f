/* flodl two-level exchange: the gradient buckets of a job with several processes per host
 * averaged the way flodl-worker does it. Inside a host the processes reduce-scatter each
 * bucket; each process sends only its shard across hosts (dense, or top-k with error feedback
 * on the shard), to the processes of the other hosts that hold the same shard; then the host
 * all-gathers the shards. With H hosts of L processes a process sends 1/L of a bucket across
 * hosts instead of a flat ring's 2(N-1)/N of all of it.
 *
 * The processes of one host find each other by host identity: the host each rank registered
 * with (fl_comm_opts_t.host, FLODL_HOST, or the address of its route to the coordinator), as
 * fl_comm_peer_host gives it. So two loopback addresses (127.0.0.1, 127.0.0.2) act as two
 * hosts on one machine. (struct fl_comm is fl_comm_t, of flodl/comm.h.)
 */
#ifndef FLODL_HIER_H
#define FLODL_HIER_H

#include <stddef.h>
#include <stdint.h>

#include <flodl/flodl.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fl_comm;

/* Where a rank sits: hosts are numbered by their lowest rank (cross_rank), and the ranks of
 * one host by rank (local_rank). uniform: every host has local_size ranks. */
typedef struct fl_hier_topo {
    int local_rank;
    int local_size;
    int cross_rank;
    int cross_size;
    int uniform;
} fl_hier_topo_t;

/* This rank's place, from the hosts the ranks registered with. No communication. FL_OK, or
 * FL_EINVAL for a NULL argument. */
int fl_hier_topology(const struct fl_comm *comm, fl_hier_topo_t *out);

typedef enum fl_hier_mode {
    FL_HIER_AUTO = 0,   /* hybrid when there are several hosts, every host has the same number
                           of ranks and that number is above 1; flat otherwise */
    FL_HIER_FLAT = 1,   /* one ring over all ranks, as fl_allreduce */
    FL_HIER_HYBRID = 2, /* reduce-scatter in the host, the shard across hosts, all-gather */
} fl_hier_mode_t;

/* Where top-k's residuals live and its selection runs. */
typedef enum fl_hier_mem {
    FL_HIER_MEM_HOST = 0, /* host memory, on the calling thread */
    FL_HIER_MEM_SIM = 1,  /* the simulated device (CI: the device code paths on host buffers,
                             which are staged into its arena) */
} fl_hier_mem_t;

typedef struct fl_hier_opts {
    size_t struct_size;             /* sizeof(fl_hier_opts_t), set by fl_hier_opts_init */
    fl_hier_mode_t hierarchy;       /* default FL_HIER_AUTO */
    size_t nbuckets;                /* buckets, exchanged in this order (required) */
    const size_t *bucket_len;       /* elements of each bucket (required; copied) */
    const fl_dtype_t *bucket_type;  /* float32, float16 or bfloat16 per bucket; NULL (default):
                                       all float32. Top-k needs float32. (copied) */
    double density;                 /* 0 (default): dense; in (0, 1]: top-k with error feedback,
                                       this fraction of each bucket's entries (of this rank's
                                       shard under hybrid) sent */
    fl_dtype_t values;              /* type top-k values travel in (default float32) */
    double max_norm;                /* top-k: clip each bucket's L2 norm to this before it joins
                                       the residual; 0 (default): no clipping */
    const char *name;               /* what the buckets are, in error texts (default
                                       "gradient"); copied */
    const char *const *bucket_name; /* each bucket's name in error texts; NULL (default):
                                       "<name> bucket <b>"; copied */
    fl_hier_mem_t memory;           /* top-k's device: FL_HIER_MEM_HOST (default) or
                                       FL_HIER_MEM_SIM; every rank must give the same */
} fl_hier_opts_t;

void fl_hier_opts_init(fl_hier_opts_t *opts);

typedef struct fl_hier fl_hier_t;

/* Collective over comm. Every rank's options are gathered first: ranks that disagree on the
 * hierarchy, the bucket layout or the top-k settings are refused on every rank with FL_EINVAL,
 * naming the rank, its host and both values. Hybrid splits comm into the host's ranks and
 * the ranks holding the same shard on other hosts (fl_comm_split); hybrid on hosts of
 * different sizes is FL_EINVAL naming two of them. The engine borrows comm, which must
 * outlive it, and is used by one thread at a time. Errors as fl_comm_split. */
int fl_hier_create(struct fl_comm *comm, const fl_hier_opts_t *opts, fl_hier_t **out);

/* Frees the engine and its sub-communicators. NULL-safe; sets *h to NULL. */
void fl_hier_destroy(fl_hier_t **h);

/* Averages bucket b over all ranks, in place: buf holds bucket_len[b] elements of bucket_type[b]
 * in host memory. Every rank calls it for the same buckets in the same order. With top-k,
 * buf's gradient joins the residual and buf receives the average of what every rank sent
 * (zeros elsewhere). Errors as fl_allreduce and fl_cmp_ef_step; after a failure the engine
 * returns FL_ECLOSED with the first cause. */
int fl_hier_allreduce(fl_hier_t *h, size_t b, void *buf);

/* Top-k: the residual this rank keeps for bucket b (its shard under hybrid): *n floats. 0
 * when dense. */
size_t fl_hier_residual_len(const fl_hier_t *h, size_t b);
/* Copies the residual of bucket b out, or in (a checkpoint's); n must be its length. */
int fl_hier_residual_get(const fl_hier_t *h, size_t b, float *out, size_t n);
int fl_hier_residual_put(fl_hier_t *h, size_t b, const float *in, size_t n);

typedef struct fl_hier_stats {
    int hybrid;                 /* 1 when the two-level exchange runs */
    fl_hier_topo_t topo;        /* this rank's place */
    uint64_t ops;               /* buckets exchanged */
    uint64_t bytes_sent;        /* payload bytes this rank sent for them */
    uint64_t bytes_sent_remote; /* of which to ranks on another host */
} fl_hier_stats_t;

void fl_hier_get_stats(const fl_hier_t *h, fl_hier_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif
