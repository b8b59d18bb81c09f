/* Private to collective/: the communicator's layout and the op engine that every algorithm
 * uses (receive with stash, deadline and abort; sends with zero-copy tracking). */
#ifndef FL_COMM_INT_H
#define FL_COMM_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "fl_coll.h"
#include "fl_msg.h"
#include "fl_tp.h"
#include "release.h"

/* Room for a communicator's ipc socket name, "r<rank>-p<pid>" or "r<rank>-p<pid>-m<n>". */
#define FL_IPC_NAME_MAX 48

/* A message that arrived for a later collective than the one running. */
typedef struct stash_ent {
    struct stash_ent *next;
    fl_tp_msg_t msg;
} stash_ent_t;

struct fl_comm {
    fl_ctx_t *ctx;
    int rank;
    int size;
    int job_rank; /* the rank in the job: a sub-communicator's error texts name it too */
    char job_id[FL_JOB_MAX];
    char coordinator[FL_ENDPOINT_MAX];
    char host[FL_HOST_MAX];
    int timeout_ms;
    int stripes;
    size_t segment_bytes;
    size_t small_bytes;
    fl_algo_t algo;
    uint64_t model_signature;
    char settings[FL_MSG_SETTINGS_MAX];

    /* From the coordinator's welcome. */
    uint64_t generation;
    fl_msg_peer_t *peers; /* size entries, by rank */
    int hb_ms;
    int hb_timeout_ms;

    /* Data plane, used only by the calling thread. */
    fl_tp_sock_t *data_in;   /* PULL, bound to this rank's endpoints */
    fl_tp_sock_t **data_out; /* PUSH per peer, connected on first use */
    char endpoints[FL_MSG_MAX_STRIPES][FL_ENDPOINT_MAX];
    int nendpoints;
    /* Same-host peers over ipc:// (comm_ipc.c): the job's socket directory ("" when this rank
     * binds no ipc), the name of this communicator's sockets there (stripe k is
     * <ipc_dir>/<ipc_name>.<k>), how many stripes are bound, and which peers are dialled over
     * it. A communicator of its own is "r<rank>-p<pid>", so peers derive it from the peer
     * table; a sub-communicator's names are unique per member and sent in the split's
     * all-gather (peer_ipc_name, "" for a member without ipc; NULL on a communicator of its
     * own). */
    bool ipc;
    char ipc_dir[96];
    char ipc_name[FL_IPC_NAME_MAX];
    int ipc_bound;
    bool *peer_ipc;
    char (*peer_ipc_name)[FL_IPC_NAME_MAX];
    /* Members made by fl_comm_split under this communicator of its own, numbering their ipc
     * names; splits of different sub-communicators run on their own threads. */
    atomic_uint ipc_members;
    struct fl_comm *root; /* the communicator of its own a sub-communicator descends from */
    stash_ent_t *stash;
    size_t stash_bytes;

    /* Membership: the rendezvous, then a control thread that heartbeats the coordinator and
     * posts failures (a dead peer, an aborted job, a silent coordinator) on `events`. */
    fl_tp_member_t *member;
    fl_tp_sock_t *events;   /* owned by member (or by tapped) */
    fl_tp_status_t *status; /* what the caller is doing, for the heartbeats; owned by member */

    /* A sub-communicator (comm_split.c) has no membership: it borrows its parent's context,
     * hears the parent's failure events on a tap of the parent's member, and keeps its status
     * status in the parent's member. NULL tapped: a communicator of its own. */
    fl_tp_member_t *tapped;

    /* Sequence of collectives; every rank numbers them the same. */
    uint64_t seq;

    /* Set once a collective failed: every later call returns FL_ECLOSED with this text. */
    int broken_rc;
    char broken_text[1024];

    /* fl_comm_abort: the rank stops on its own error, said in its goodbye. */
    bool aborted;
    int abort_rc;
    char abort_text[768];
    /* Aborted over another's failure before any collective heard of it: the goodbye waits
     * for the coordinator's word on who failed. */
    bool await_verdict;
    bool goodbye_sent;

    /* Zero-copy sends not yet released by ZeroMQ, per region (ring chunk; index size is
     * "anything else"). The release hook runs in ZeroMQ's I/O thread. */
    fl_rel_t *inflight;

    /* Working memory for accumulation in a wider type, reused across calls. */
    void *scratch;
    size_t scratch_cap;

    /* The compressor's scratch for sparse collectives (created on first use). */
    struct fl_cmp_ws *cmp_ws;

    /* Host memory for staging device buffers. */
    void *stage;
    size_t stage_cap;

    /* Counters. */
    uint64_t ops;
    uint64_t bytes_sent;
    uint64_t bytes_sent_remote; /* to peers with another host address */
    uint64_t bytes_recv;
    fl_algo_t last_algo;
};

/* ---- communicator internals (comm.c, comm_rendezvous.c) ---- */

/* Registers with the coordinator and takes the peer table from the welcome
 * (comm_rendezvous.c). */
int fl_comm_rendezvous(fl_comm_t *c, int timeout_ms);

/* Binds the data socket on `stripes` endpoints (bind: the base endpoint, NULL for tcp on this
 * rank's host with ephemeral ports) and records what peers should dial (comm.c). */
int fl_comm_bind_data(fl_comm_t *c, const char *bind, int stripes);

/* Binds the data socket on ipc:// too, one socket per stripe in the job's private directory,
 * when that directory can be made private; otherwise logs why and leaves peers on TCP. Always
 * FL_OK: where ipc cannot be had, TCP serves (comm_ipc.c). */
int fl_comm_ipc_bind(fl_comm_t *c, int stripes);

/* Removes this rank's sockets and, when it is empty, the job's directory. Idempotent. */
void fl_comm_ipc_remove(fl_comm_t *c);

/* The ipc endpoint of peer's stripe k when the peer is on this host and its socket is there;
 * false: dial it over TCP. */
bool fl_comm_ipc_endpoint(const fl_comm_t *c, int peer, uint32_t k, char *out, size_t cap);

/* The tuning string every rank must share ("seg=1048576,small=65536,algo=0"). */
void fl_comm_tuning(const fl_comm_t *c, char *out, size_t cap);

/* "rank 3 (host-a)": a peer's name for error texts. */
const char *fl_comm_peer_name(const fl_comm_t *c, int rank, char *buf, size_t cap);

/* The PUSH socket to peer, created and connected on first use. FL_OK or FL_EIO/FL_ENOMEM. */
int fl_comm_peer_sock(fl_comm_t *c, int peer, fl_tp_sock_t **out);

/* Grows the scratch area to at least bytes. FL_OK or FL_ENOMEM. */
int fl_comm_scratch(fl_comm_t *c, size_t bytes, void **out);

/* fl_allreduce with this algorithm (FL_ALGO_AUTO: picked by size) instead of the
 * communicator's (collectives.c). */
int fl_allreduce_algo(fl_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                      fl_dtype_t dtype, fl_op_t op, fl_algo_t algo);

/* ---- device buffers (staging.c) ---- */

/* True when a or b is CUDA device memory. Loads no driver: false at once in a process that
 * never used CUDA. */
bool fl_comm_on_device(const fl_comm_t *c, const void *a, const void *b);

/* The public collectives with device buffers staged through host memory. */
int fl_staged_allreduce(fl_comm_t *c, const void *send, void *recv, size_t count, fl_dtype_t dt,
                        fl_op_t op);
int fl_staged_reduce_scatter(fl_comm_t *c, const void *send, void *recv, size_t count,
                             fl_dtype_t dt, fl_op_t op);
int fl_staged_allgather(fl_comm_t *c, const void *send, void *recv, size_t count, fl_dtype_t dt);
int fl_staged_broadcast(fl_comm_t *c, void *buf, size_t count, fl_dtype_t dt, int root);

/* ---- op engine (coll_op.c) ---- */

typedef struct coll_op {
    fl_comm_t *c;
    fl_coll_kind_t kind;
    uint64_t seq;
    size_t count;
    fl_dtype_t dtype;
    fl_op_t op;
    int root;
    int64_t deadline;
    int waiting_on; /* peer whose data is awaited, for error texts and heartbeats */
    uint32_t phase;
    uint32_t step;
    size_t msgs_got;
    size_t msgs_expected;
} coll_op_t;

/* Starts a collective: refuses on a broken communicator, numbers it, arms the deadline. */
int fl_coll__begin(fl_comm_t *c, coll_op_t *op, fl_coll_kind_t kind, size_t count, fl_dtype_t dtype,
                   fl_op_t rop, int root);

/* Ends a collective with rc: waits for this op's zero-copy sends to be released; on failure
 * prefixes the detail with the op and breaks the communicator. Returns rc. */
int fl_coll__end(coll_op_t *op, int rc);

/* Fails the op with a detail naming rank, host, op and progress. Returns code. */
int fl_coll__fail(coll_op_t *op, int code, const char *fmt, ...) FL_PRINTF(3, 4);

/* Next message of this op (CHUNK or BARRIER, right collective, count, dtype and operator,
 * from a valid peer), from the stash or the socket. Messages of later ops are stashed; bad
 * ones are counted and dropped. Waits until the op deadline; returns early on an abort event
 * from the control thread. The caller closes the message. */
int fl_coll__recv(coll_op_t *op, fl_tp_msg_t *m);

/* Sends a chunk header with one payload frame to peer. region >= 0: zero-copy, tracked in
 * inflight[region] (the memory must stay untouched until fl_coll__wait_region(region)); region
 * < 0: copied. */
int fl_coll__send(coll_op_t *op, int peer, const fl_msg_chunk_t *ck, const void *data, size_t bytes,
                  fl_dtype_t wire, int region);

/* Sends one encoded sparse block (copied; codec FL_CODEC_SPARSE). */
int fl_coll__send_block(coll_op_t *op, int peer, const fl_msg_chunk_t *ck, const void *data,
                        size_t bytes);

/* Sends a payload-less message (barrier rounds). */
int fl_coll__send_empty(coll_op_t *op, int peer, fl_msg_type_t type, const fl_msg_barrier_t *b);

/* Waits until every zero-copy send from region was released. */
int fl_coll__wait_region(coll_op_t *op, int region);

/* Checks that a chunk message carries exactly count elements of the wire dtype. */
int fl_coll__check_payload(coll_op_t *op, fl_tp_msg_t *m, fl_dtype_t wire, size_t count);

/* ---- algorithms ---- */

/* Ring reduce-scatter then all-gather. */
int fl_ring_allreduce(coll_op_t *op, const void *sendbuf, void *recvbuf);
/* Ring reduce-scatter: recvbuf gets this rank's shard. */
int fl_ring_reduce_scatter(coll_op_t *op, const void *sendbuf, void *recvbuf);
/* Ring all-gather of shards. */
int fl_ring_allgather(coll_op_t *op, const void *sendbuf, void *recvbuf);
/* Recursive doubling allreduce (any N; extra ranks fold in and out). */
int fl_rd_allreduce(coll_op_t *op, const void *sendbuf, void *recvbuf);
/* One-shot: whole contributions to every peer, reduced in rank order. */
int fl_direct_allreduce(coll_op_t *op, const void *sendbuf, void *recvbuf);
/* Binomial tree for small buffers, pipelined chain for large ones. */
int fl_bcast(coll_op_t *op, void *buf);
/* Dissemination barrier. */
int fl_dissem_barrier(coll_op_t *op);

#endif
