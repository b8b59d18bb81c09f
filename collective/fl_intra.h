/* The intra-host collectives: reduce-scatter (sum, avg), all-gather and broadcast among the L
 * devices of one host, on float32 device buffers (fl_dptr_t), each device's part queued on a
 * stream of that device. Three implementations behind one handle: NCCL (distinct CUDA GPUs,
 * intra_nccl.cu), device copies and a sum kernel (sim, and logical devices sharing a GPU,
 * intra_copy.c), host memory (cpu replicas, intra_host.c). The cross-host leg and the worker's
 * schedule are the caller's: this header knows devices, not ranks or sockets. */
#ifndef FL_INTRA_H
#define FL_INTRA_H

#include <stdbool.h>
#include <stddef.h>

#include "fl_core.h"
#include "fl_dev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most devices of one host: the device layer's bound. */
#define FL_INTRA_MAX_DEVICES FL_DEV_MAX_DEVICES

typedef enum fl_intra_impl {
    FL_INTRA_AUTO = 0, /* cpu: host; sim: copy; cuda: nccl when built and the GPUs are distinct,
                          else copy */
    FL_INTRA_NCCL = 1,
    FL_INTRA_COPY = 2,
    FL_INTRA_HOST = 3,
} fl_intra_impl_t;

const char *fl_intra_impl_name(fl_intra_impl_t impl);

/* True when this build has the NCCL implementation (CUDA and NCCL found at build time). */
bool fl_intra_nccl_built(void);

typedef struct fl_intra_opts {
    fl_intra_impl_t impl; /* default FL_INTRA_AUTO */
    int timeout_ms;       /* bound of fl_intra_wait and of NCCL's setup (default 600000) */
    const char *host;     /* named in every error ("rank 3"; default the host's name); borrowed
                             for the handle's life */
} fl_intra_opts_t;

void fl_intra_opts_init(fl_intra_opts_t *o);

typedef struct fl_intra fl_intra_t;

/* ---- layout: counts padded to a multiple of L ----
 * A collective over count elements works on fl_intra_padded(count, L) = L * S elements of
 * every device's buffer, S = ceil(count / L): shard j is [j S, (j + 1) S), the same rule on
 * every implementation (NCCL needs equal counts). The caller allocates the padded size and
 * zeroes the padding [count, L S) once; every operation keeps zeros there (a sum or average of
 * zeros is zero, a gather copies them), so the padding stays zero for the buffer's life. */
size_t fl_intra_padded(size_t count, int L);
/* S: the elements of one shard. */
size_t fl_intra_shard_len(size_t count, int L);

/* A handle over devs[0..L-1] (borrowed: they outlive the handle), all of one kind. The copy
 * implementation allocates its scratch on each device lazily, sized by the widest call.
 * FL_OK; FL_EINVAL (L outside 1..FL_INTRA_MAX_DEVICES, mixed kinds, an implementation that
 * cannot serve these devices: host on sim or cuda, nccl without NCCL or with a GPU listed
 * twice), FL_EGPU (NCCL's setup failed: the host, the device and ncclGetErrorString named),
 * FL_ETIMEDOUT (NCCL's setup did not finish in timeout_ms; the communicators are aborted),
 * FL_ENOMEM. */
int fl_intra_create(fl_dev_t *const *devs, int L, const fl_intra_opts_t *o, fl_intra_t **out);

/* Waits for nothing: call fl_intra_wait first when work is queued. NULL-safe. */
void fl_intra_destroy(fl_intra_t **x);

fl_intra_impl_t fl_intra_impl(const fl_intra_t *x);
int fl_intra_size(const fl_intra_t *x);

/* ---- the operations ----
 * The unit is a bucket: one call per bucket and operation (NCCL: one ncclGroupStart/End around
 * its L calls). Each is called once for all L devices from one thread (one thread at a time
 * per handle):
 * bufs[j] is device j's buffer (fl_intra_padded(count, L) floats), streams[j] a stream of
 * device j. Device j's part is queued on streams[j] behind what streams[j] holds: the caller
 * orders its producers before (an event wait on streams[j]) and its consumers after (an
 * fl_event_record on streams[j] after the call, or done). When streams[j] has run past the
 * call, device j's result is in place and the other devices have finished reading bufs[j]
 * (as with NCCL, a buffer may be rewritten once its own stream passed the call). done (may be
 * NULL) gets done[j] recorded on streams[j] after device j's part: the event the cross-host
 * leg waits for. The implementation's own events and scratch are reused by the next call.
 * Returns FL_OK once queued (cpu: done); FL_EINVAL for bad arguments (a stream of another
 * device, op not sum or avg); FL_EGPU naming the host, the device, the operation and the
 * CUDA/NCCL error; or the error a previous call left on the handle (a handle whose NCCL
 * communicator was aborted stays failed). Failures of queued work are reported by
 * fl_intra_wait or the streams' own syncs.
 *
 * Sum order (copy and host: fixed, so results are bit-exact across runs and backends): for
 * each element, ((b0 + b1) + b2) + ... + b(L-1) in device order, in float32; avg then
 * multiplies by (1.0f / L). NCCL's order is NCCL's (exact for L = 1, within float rounding
 * otherwise). */

/* In place: shard j of bufs[j] becomes the sum (op FL_SUM) or average (FL_AVG) over devices of
 * shard j; the other shards of bufs[j] are left as they were. */
int fl_intra_reduce_scatter(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, fl_op_t op,
                            fl_stream_t *const *streams, fl_event_t *const *done);

/* In place: every bufs[j] gets shard k of bufs[k], for every k. */
int fl_intra_allgather(fl_intra_t *x, const fl_dptr_t *bufs, size_t count,
                       fl_stream_t *const *streams, fl_event_t *const *done);

/* bufs[j] = bufs[root] over count elements (no padding needed), for every j. */
int fl_intra_broadcast(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, int root,
                       fl_stream_t *const *streams, fl_event_t *const *done);

/* Waits until every device's stream has run past the last call, bounded by timeout_ms (<= 0:
 * the handle's). FL_OK; the error of a device's queued work (its text names the device and
 * the operation); FL_ETIMEDOUT naming the host, the devices not done and the operation (NCCL:
 * the communicators are aborted first, so nothing stays blocked on the GPUs, and the handle
 * stays failed); FL_EGPU from ncclCommGetAsyncError, naming host, device, operation and the
 * NCCL error. */
int fl_intra_wait(fl_intra_t *x, int timeout_ms);

/* For a caller that waits for its own events recorded behind the handle's calls (the
 * worker's overlapped first leg, which waits bucket by bucket): without waiting, FL_OK, the
 * error a failed handle keeps, or an asynchronous failure of queued work the implementation
 * sees (NCCL: ncclCommGetAsyncError, naming the host, the device, the operation and NCCL's
 * text). One thread at a time with the handle's other calls. */
int fl_intra_poll(fl_intra_t *x);

/* Stops what is blocked on the devices (NCCL: ncclCommAbort on every communicator) and leaves
 * the handle failed with rc and the calling thread's detail text, which the caller sets first
 * (a poll's error, or its deadline naming what was late). Returns rc. One thread at a time
 * with the handle's other calls. */
int fl_intra_abort(fl_intra_t *x, int rc);

/* The handle's deadline (fl_intra_opts_t.timeout_ms). */
int fl_intra_timeout_ms(const fl_intra_t *x);

#ifdef __cplusplus
}
#endif

#endif
