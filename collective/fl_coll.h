/* collective: the communicator (rendezvous client, control thread, peer sockets) and the
 * collectives over transport/: ring reduce-scatter / all-gather / allreduce, recursive doubling,
 * broadcast, barrier. The public face is include/flodl/comm.h; this header holds the pure
 * pieces (ring plan, reduction kernels) that tests and later components use directly. */
#ifndef FL_COLL_H
#define FL_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <flodl/comm.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective kinds on the wire (Chunk.coll). */
typedef enum fl_coll_kind {
    FL_COLL_ALLREDUCE = 1,
    FL_COLL_REDUCE_SCATTER = 2,
    FL_COLL_ALLGATHER = 3,
    FL_COLL_BROADCAST = 4,
    FL_COLL_BARRIER = 5,
    FL_COLL_SPARSE_ALLREDUCE = 6,
} fl_coll_kind_t;

/* Phases on the wire (Chunk.phase). */
typedef enum fl_coll_phase {
    FL_PHASE_RS = 1,      /* ring reduce-scatter */
    FL_PHASE_AG = 2,      /* ring all-gather */
    FL_PHASE_RD_PRE = 3,  /* recursive doubling: fold the extra ranks in */
    FL_PHASE_RD = 4,      /* recursive doubling rounds */
    FL_PHASE_RD_POST = 5, /* recursive doubling: hand the result to the extra ranks */
    FL_PHASE_BCAST = 6,
    FL_PHASE_DIRECT = 7, /* one-shot: whole contributions to every peer */
} fl_coll_phase_t;

const char *fl_coll_kind_name(int kind);

/* The communicator's context (its counters by kind, for the binaries' metrics); sub-
 * communicators share their parent's. */
fl_ctx_t *fl_comm_ctx(const fl_comm_t *comm);

/* The job's ipc socket directory of this rank, "" when it binds no ipc:// (turned off, an
 * explicit bind, a sub-communicator, or a directory it could not make private). */
const char *fl_comm_ipc_dir(const fl_comm_t *comm);

/* The socket directory of the job's ranks on this host: /tmp/flodl-<euid>-<hash of job id
 * and coordinator endpoint as given>. */
void fl_comm_ipc_dir_name(const char *job_id, const char *coordinator, char *out, size_t cap);

/* True when this rank's data to peer goes over ipc:// (its socket is opened by then). */
bool fl_comm_peer_is_ipc(const fl_comm_t *comm, int peer);
const char *fl_coll_phase_name(int phase);

/* ---- options by name (comm_opts.c) ---- */

/* Sets one communicator option from text, as the binaries' flags spell it ("world-size",
 * "coordinator", "segment" takes 1M-style sizes, ...). String values are borrowed: they must
 * outlive the options. FL_OK or FL_EINVAL naming the flag and the problem. */
int fl_comm_opts_set(fl_comm_opts_t *opts, const char *key, const char *value);

/* NULL-terminated list of the names fl_comm_opts_set accepts. */
extern const char *const fl_comm_opt_names[];

/* ---- ring plan (ring_plan.c): which chunk and segment goes where, no IO ---- */

static inline int fl_ring_mod(long a, int n)
{
    long m = a % n;
    return (int)(m < 0 ? m + n : m);
}

/* Reduce-scatter step s (0..N-2): rank r sends chunk (r-s-1) to r+1 and reduces chunk (r-s-2)
 * arriving from r-1, so that after N-1 steps rank r owns chunk r. */
static inline int fl_ring_rs_send_chunk(int rank, int step, int n)
{
    return fl_ring_mod((long)rank - step - 1, n);
}
static inline int fl_ring_rs_recv_chunk(int rank, int step, int n)
{
    return fl_ring_mod((long)rank - step - 2, n);
}
/* All-gather step s (0..N-2): rank r sends chunk (r-s) and receives chunk (r-s-1). */
static inline int fl_ring_ag_send_chunk(int rank, int step, int n)
{
    return fl_ring_mod((long)rank - step, n);
}
static inline int fl_ring_ag_recv_chunk(int rank, int step, int n)
{
    return fl_ring_mod((long)rank - step - 1, n);
}

/* Segments of a chunk of cnt elements, segn elements each (the last may be shorter; a chunk of
 * zero elements has no segments). */
static inline uint32_t fl_ring_nseg(size_t cnt, size_t segn)
{
    return (uint32_t)((cnt + segn - 1) / segn);
}

/* ---- allreduce algorithm choice (algo_pick.c) ---- */

/* One-shot sends N-1 copies of the buffer: beyond this many ranks recursive doubling's log2(N)
 * rounds cost less than the fan-out. */
#define FL_DIRECT_MAX_RANKS 8

/* Up to this many bytes (and small_bytes) AUTO runs one-shot on up to FL_DIRECT_MAX_RANKS
 * ranks; above it, recursive doubling, whose two rounds at 4 ranks beat one-shot's fan-out of
 * whole buffers as they grow (measured on loopback: flodl-bench allreduce --algos). */
#define FL_DIRECT_MAX_BYTES ((size_t)8 << 10)

/* The algorithm FL_ALGO_AUTO runs for an allreduce of bytes over n ranks: one-shot up to
 * FL_DIRECT_MAX_BYTES on up to FL_DIRECT_MAX_RANKS ranks, recursive doubling up to small_bytes,
 * the ring above. Every rank computes the same choice from the same arguments. */
fl_algo_t fl_allreduce_pick(int n, size_t bytes, size_t small_bytes);

/* Elements per segment for a segment size in bytes and an element size (at least 1 element,
 * and at most 4096 segments per chunk so that queues stay short). */
size_t fl_ring_segn(size_t chunk_cnt, size_t elem_bytes, size_t segment_bytes);

/* ---- reduction kernels (reduce.c): pure loops, incoming data may be unaligned ---- */

/* The type partial results travel and accumulate in: float32 for float16/bfloat16, else the
 * dtype itself. */
fl_dtype_t fl_acc_dtype(fl_dtype_t dtype);

/* True when op is defined on dtype (AVG on floats only; nothing on uint8). */
bool fl_op_supports(fl_op_t op, fl_dtype_t dtype);

/* dst[i] = widen(local[i]) op in[i]. local has dtype; in and dst have fl_acc_dtype(dtype).
 * dst may equal local when dtype is its own accumulation type. AVG combines as SUM. */
void fl_reduce_combine(fl_op_t op, fl_dtype_t dtype, void *dst, const void *local, const void *in,
                       size_t n);

/* dst[i] = widen(src[i]): dtype to its accumulation type. */
void fl_reduce_widen(fl_dtype_t dtype, void *dst, const void *src, size_t n);

/* out[i] = narrow(acc[i] / nranks for AVG, else acc[i]). acc has the accumulation type, out
 * has dtype; out may equal acc when they are the same type. */
void fl_reduce_finish(fl_op_t op, fl_dtype_t dtype, void *out, const void *acc, size_t n,
                      int nranks);

#ifdef __cplusplus
}
#endif

#endif
