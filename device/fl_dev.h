/* device: where model-sized numbers are computed. One device is a GPU (cuda: cuBLAS and flodl's
 * kernels), a simulated GPU for machines without one (sim: a separate memory arena and one
 * thread per stream, so the ordering bugs of real GPUs happen here too), or the host itself
 * (cpu: OpenBLAS, every operation done when it is issued). Callers hold opaque handles and
 * device addresses of an opaque type; work is ordered with streams and events as in CUDA.
 * The per-element math is fl_math.h's, shared by the host loops and the CUDA kernels. */
#ifndef FL_DEV_H
#define FL_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fl_dev_kind {
    FL_DEV_CPU = 0,  /* the host: OpenBLAS, synchronous */
    FL_DEV_SIM = 1,  /* a simulated asynchronous GPU (CI) */
    FL_DEV_CUDA = 2, /* a CUDA GPU */
} fl_dev_kind_t;

/* Parses "cpu|sim|cuda". FL_OK or FL_EINVAL. */
int fl_dev_kind_parse(const char *s, fl_dev_kind_t *out);
const char *fl_dev_kind_name(fl_dev_kind_t kind);

/* True when this build has the CUDA backend (nvcc was found). */
bool fl_dev_cuda_built(void);

/* How many devices of a kind can be opened: cpu and sim 1 (sim devices are made on demand, any
 * id), cuda the usable GPUs. Loads the CUDA driver only when asked about cuda. When there are
 * none, why (may be NULL) gets one line: "CUDA not built in", "no usable CUDA driver: ...",
 * "no CUDA device". Never fails. Thread-safe. */
int fl_dev_count(fl_dev_kind_t kind, char *why, size_t cap);

/* The most devices one process drives, the bound of every per-device array: a host's GPUs, each
 * maybe listed more than once (--gpus 0,0), or cpu replicas, with room above the 8 or 16 GPUs
 * of today's largest hosts. */
#define FL_DEV_MAX_DEVICES 64

/* A device address: not a host pointer. It cannot be dereferenced or offset by ordinary C
 * arithmetic (a compile error); fl_dptr_at offsets it. */
typedef struct fl_dptr {
    void *opaque_;
} fl_dptr_t;

static inline fl_dptr_t fl_dptr_at(fl_dptr_t p, size_t bytes)
{
    fl_dptr_t q = {(char *)p.opaque_ + bytes};
    return q;
}

/* The address of float element i. */
static inline fl_dptr_t fl_dptr_f32(fl_dptr_t p, size_t i)
{
    return fl_dptr_at(p, i * sizeof(float));
}

static inline bool fl_dptr_is_null(fl_dptr_t p)
{
    return p.opaque_ == NULL;
}

/* The raw device address, for a library that takes one (NCCL in collective/); never a host
 * pointer to dereference. */
static inline void *fl_dptr_native(fl_dptr_t p)
{
    return p.opaque_;
}

static inline fl_dptr_t fl_dptr_null(void)
{
    fl_dptr_t q = {NULL};
    return q;
}

typedef struct fl_dev fl_dev_t;
typedef struct fl_stream fl_stream_t;
typedef struct fl_event fl_event_t;

typedef struct fl_dev_opts {
    fl_dev_kind_t kind;      /* default cpu */
    int id;                  /* cuda: the GPU's ordinal; sim: a label */
    size_t mem_bytes;        /* sim: the arena's capacity (default 16 GiB, address space only) */
    int sim_jitter_us;       /* sim: each operation starts after a random 0..N us, widening the
                                window of a missing event (0: none) */
    int timeout_ms;          /* bound of every wait inside the backend (default 600000) */
    const char *sim_fail_op; /* sim, fault injection (tests): the sim_fail_after-th run of the
                                operation of this name (as the backend's errors name it, e.g.
                                "GEMM (weight gradient)") on this device fails its stream with
                                FL_EGPU, as a GPU fault would; NULL: none. Borrowed for the
                                device's life. */
    long sim_fail_after;
    int sim_stall_ms;   /* sim: > 0: that run stalls its stream this long, then succeeds
                           (a kernel that hangs), instead of failing */
    bool sim_late_done; /* sim (tests): an event still pending when a wait shorter than
                           timeout_ms starts completes only after that wait has timed out:
                           the race between a poll slice's end and the completion, every
                           time */
} fl_dev_opts_t;

void fl_dev_opts_init(fl_dev_opts_t *o);

/* Opens device o->id of o->kind. FL_OK; FL_EINVAL (bad options, an id out of range: the detail
 * names the id and how many there are); FL_EGPU (CUDA: no driver or device, the CUDA error and
 * the device id in the detail); FL_ENOMEM. */
int fl_dev_create(const fl_dev_opts_t *o, fl_dev_t **out);

/* Destroys the device after its streams, events and memory. NULL-safe. */
void fl_dev_destroy(fl_dev_t **d);

fl_dev_kind_t fl_dev_kind(const fl_dev_t *d);
int fl_dev_id(const fl_dev_t *d);

/* "cpu", "sim:1", "cuda:0 (NVIDIA H100 80GB HBM3)". */
const char *fl_dev_name(const fl_dev_t *d);

/* Bytes free and in total on the device (cpu: the host's available and total memory). */
int fl_dev_mem_info(fl_dev_t *d, size_t *free_bytes, size_t *total_bytes);

/* Makes the device current for the calling thread (CUDA's cudaSetDevice; nothing elsewhere).
 * Every thread that issues work to a device calls it once. */
int fl_dev_bind(fl_dev_t *d);

/* ---- memory ---- */

/* Device memory, uninitialised. FL_OK or FL_ENOMEM naming the device, the bytes asked for and
 * the bytes free. fl_dev_free is NULL-safe and sets *p to null. Free only memory no queued
 * work still uses; on cuda a free waits for the whole device (cudaFree), so free outside the
 * steps, not inside them. */
int fl_dev_alloc(fl_dev_t *d, size_t bytes, fl_dptr_t *out);
void fl_dev_free(fl_dev_t *d, fl_dptr_t *p);

/* Host memory as a device address, on the cpu backend only, whose device memory is host memory:
 * host buffers then go through the same calls without copies. FL_EINVAL on sim and cuda. */
int fl_dev_wrap(fl_dev_t *d, const void *host, fl_dptr_t *out);

/* The host address of device memory on the cpu backend (fl_dev_wrap's inverse), for host-memory
 * code that works on cpu replicas' buffers in place. FL_EINVAL on sim and cuda. */
int fl_dev_unwrap(fl_dev_t *d, fl_dptr_t p, void **out);

/* Device memory standing for the host buffer `host` of `bytes`: on cpu the buffer itself (so
 * copies between the two cost nothing), elsewhere new device memory. fl_dev_unmirror releases
 * it (NULL-safe, sets *p to null). */
int fl_dev_mirror(fl_dev_t *d, void *host, size_t bytes, fl_dptr_t *out);
void fl_dev_unmirror(fl_dev_t *d, fl_dptr_t *p);

/* Page-locks the caller's host buffer for the device's copies (cudaHostRegister; nothing on cpu
 * and sim), so copies to and from it are asynchronous: a copy to or from pageable memory on
 * cuda blocks the thread that queues it. Unregister before freeing it. */
int fl_dev_host_register(fl_dev_t *d, void *p, size_t bytes);
void fl_dev_host_unregister(fl_dev_t *d, void *p);

/* Page-locked host memory for fast asynchronous copies (plain host memory on cpu and sim). */
int fl_dev_host_alloc(fl_dev_t *d, size_t bytes, void **out);
void fl_dev_host_free(fl_dev_t *d, void *p);

/* ---- streams and events: the ordering language ---- */

/* A queue of operations that run in order, asynchronously to the host (cpu: at once). */
int fl_stream_create(fl_dev_t *d, fl_stream_t **out);
/* Waits for what is queued (bounded by the device's timeout), then destroys. NULL-safe. */
void fl_stream_destroy(fl_stream_t **s);
fl_dev_t *fl_stream_dev(const fl_stream_t *s);

/* Waits until everything queued on s has run. FL_OK, FL_ETIMEDOUT naming the device, or the
 * error of an operation that failed (an error on a stream stays until the stream is
 * destroyed: later operations are skipped, as CUDA's sticky errors). */
int fl_stream_sync(fl_stream_t *s, int timeout_ms);

int fl_event_create(fl_dev_t *d, fl_event_t **out);
void fl_event_destroy(fl_event_t **e);

/* The event completes when what s holds now has run. Re-recording moves it (a wait queued
 * before waits for the record it saw; on sim, for every record up to that one). */
int fl_event_record(fl_event_t *e, fl_stream_t *s);

/* What is queued on s after this waits for e's last record (nothing if never recorded). e may
 * be an event of another device of the same kind (as cudaStreamWaitEvent allows): the hand-off
 * between the devices of one host. */
int fl_stream_wait(fl_stream_t *s, fl_event_t *e);

/* The backend's own stream for libraries that queue work on it themselves (NCCL): the
 * cudaStream_t on cuda, NULL on cpu and sim. Valid until the stream is destroyed. */
void *fl_stream_native(fl_stream_t *s);

/* An event whose completions are timed, for fl_event_elapsed_ms (on cuda a timing event, a
 * little slower to record than fl_event_create's). */
int fl_event_create_timed(fl_dev_t *d, fl_event_t **out);

/* The device's time between the completions of start's and end's last records (timed events of
 * one device, both recorded and completed; wait for end first): cuda's cudaEventElapsedTime,
 * on cpu and sim the host clock when each record completed. FL_OK; FL_EINVAL (an event not
 * timed, of another device, never recorded or not yet completed). Thread-safe. */
int fl_event_elapsed_ms(fl_event_t *start, fl_event_t *end, double *ms);

/* Whether e's last record has completed (never recorded: true). */
bool fl_event_done(fl_event_t *e);

/* Waits for e's last record. FL_OK, FL_ETIMEDOUT, or the recording stream's error. */
int fl_event_sync(fl_event_t *e, int timeout_ms);

/* ---- copies and fills, queued on s (host buffers must stay valid until they ran) ----
 * Host buffers from fl_dev_host_alloc copy asynchronously; on cuda a copy to or from other host
 * memory blocks the calling thread until it is done. A device copy's source and destination
 * must not overlap. */

int fl_dev_h2d(fl_stream_t *s, fl_dptr_t dst, const void *src, size_t bytes);
int fl_dev_d2h(fl_stream_t *s, void *dst, fl_dptr_t src, size_t bytes);
int fl_dev_d2d(fl_stream_t *s, fl_dptr_t dst, fl_dptr_t src, size_t bytes);
int fl_dev_memset(fl_stream_t *s, fl_dptr_t dst, int byte, size_t bytes);

/* A copy from the memory of another device of the same kind (or of s's own): dst on s's
 * device, src on src_dev. The caller orders it after src_dev's writers with an event wait on s
 * (fl_stream_wait takes the other device's event). cuda: cudaMemcpyPeerAsync; sim checks src
 * against src_dev's memory. FL_EINVAL for a device of another kind. */
int fl_dev_peer_copy(fl_stream_t *s, fl_dptr_t dst, fl_dev_t *src_dev, fl_dptr_t src, size_t bytes);

/* ---- GEMM, row-major float32 (the three layouts of a linear layer) ---- */

/* z[b, out] = x[b, in] w[out, in]^T + beta z (beta 1: z holds the broadcast bias). */
int fl_dev_gemm_fwd(fl_stream_t *s, size_t b, size_t out, size_t in, fl_dptr_t x, fl_dptr_t w,
                    float beta, fl_dptr_t z);
/* gw[out, in] = dz[b, out]^T a[b, in]. */
int fl_dev_gemm_wgrad(fl_stream_t *s, size_t b, size_t out, size_t in, fl_dptr_t dz, fl_dptr_t a,
                      fl_dptr_t gw);
/* da[b, in] = dz[b, out] w[out, in]. */
int fl_dev_gemm_igrad(fl_stream_t *s, size_t b, size_t out, size_t in, fl_dptr_t dz, fl_dptr_t w,
                      fl_dptr_t da);

/* ---- kernels (elementwise results bit for bit the same on every backend) ---- */

/* z[r, :] = bias for each of rows rows of cols. */
int fl_dev_bias_rows(fl_stream_t *s, fl_dptr_t z, fl_dptr_t bias, size_t rows, size_t cols);
/* z = max(z, 0) over n entries. */
int fl_dev_relu(fl_stream_t *s, fl_dptr_t z, size_t n);
/* da = 0 where a <= 0 (the ReLU was off). */
int fl_dev_relu_back(fl_stream_t *s, fl_dptr_t da, fl_dptr_t a, size_t n);
/* gb[j] = sum over rows of dz[r, j], rows in order. */
int fl_dev_bias_grad(fl_stream_t *s, fl_dptr_t gb, fl_dptr_t dz, size_t rows, size_t cols);

/* Softmax cross-entropy of logits[rows, classes] against labels (int32, each in 0..classes-1:
 * the caller checks them). dz (may be null): (softmax - onehot) / rows. out: two doubles, the
 * summed loss over the rows and the count of rows whose arg-max is the label. row_loss: a
 * scratch of rows doubles. */
int fl_dev_xent(fl_stream_t *s, fl_dptr_t logits, fl_dptr_t labels, size_t rows, size_t classes,
                fl_dptr_t dz, fl_dptr_t row_loss, fl_dptr_t out);

/* out[i] = (in[i] + in[cols + i] + ... + in[(rows - 1) cols + i]) * alpha for i < cols: rows
 * added in order (fl_sum_rows), the product skipped when alpha is 1. out must not overlap in.
 * The intra-host reduction's kernel: the devices' shards gathered as rows of in. */
int fl_dev_sum_rows(fl_stream_t *s, fl_dptr_t out, fl_dptr_t in, size_t cols, size_t rows,
                    float alpha);

/* x *= alpha. */
int fl_dev_scale(fl_stream_t *s, fl_dptr_t x, size_t n, float alpha);
/* y += alpha x. */
int fl_dev_axpy(fl_stream_t *s, fl_dptr_t y, fl_dptr_t x, size_t n, float alpha);
/* out (one double) = sum of x^2 (in double). */
int fl_dev_sumsq(fl_stream_t *s, fl_dptr_t x, size_t n, fl_dptr_t out);
/* out (one int64) = the index of the first NaN or Inf of x, or -1. */
int fl_dev_nonfinite(fl_stream_t *s, fl_dptr_t x, size_t n, fl_dptr_t out);

/* One optimizer step over n entries with the scalars of fl_opt_scalars: p, g and the state
 * buffers (buf1: SGD's momentum or Adam's m, unused for plain SGD; buf2: Adam's v). */
int fl_dev_opt_update(fl_stream_t *s, const fl_opt_scalars_t *sc, fl_dptr_t p, fl_dptr_t g,
                      fl_dptr_t buf1, fl_dptr_t buf2, size_t n);

/* Error feedback, accumulate: v += u with u = m u + scale g (momentum > 0), else v += scale g. */
int fl_dev_ef_accum(fl_stream_t *s, fl_dptr_t v, fl_dptr_t u, fl_dptr_t g, size_t n, float m,
                    float scale);
/* Error feedback, after top-k chose k pairs (idx, val) of the n entries of v: val rounded to
 * the wire (FL_WIRE_*), v[idx] -= the rounded value, u[idx] = 0 (u may be null). An index at or
 * past n fails the stream (cpu, sim) or is skipped (cuda). */
int fl_dev_ef_sent(fl_stream_t *s, fl_dptr_t v, fl_dptr_t u, fl_dptr_t idx, fl_dptr_t val, size_t k,
                   size_t n, int wire);

/* ---- top-k by magnitude: the set of compression's exact mode (ties to the lower index,
 *      indices ascending) ---- */

typedef struct fl_dev_topk fl_dev_topk_t;

/* A workspace for tensors of up to n_max entries, made once (no allocation per call). */
int fl_dev_topk_create(fl_dev_t *d, size_t n_max, fl_dev_topk_t **out);
void fl_dev_topk_destroy(fl_dev_topk_t **t);

/* Queues the selection of the k largest |x| of n into idx (uint32) and val (float), k entries
 * each. out: two int64, the count written (k, or 0 when x holds a NaN or Inf) and the index
 * of the first NaN or Inf (-1: none). One stream at a time per workspace. */
int fl_dev_topk(fl_stream_t *s, fl_dev_topk_t *t, fl_dptr_t x, size_t n, size_t k, fl_dptr_t idx,
                fl_dptr_t val, fl_dptr_t out);

/* ---- the optimizer with its state on a device ---- */

typedef struct fl_dev_opt fl_dev_opt_t;

/* o's optimizer over n parameters, its state zeroed on d. FL_OK, FL_EINVAL (as fl_opt_create),
 * FL_ENOMEM naming the device. */
int fl_dev_opt_create(fl_dev_t *d, const fl_opt_opts_t *o, size_t n, fl_dev_opt_t **out);
void fl_dev_opt_destroy(fl_dev_opt_t **o);
size_t fl_dev_opt_size(const fl_dev_opt_t *o);
/* State bytes on the device. */
size_t fl_dev_opt_state_bytes(const fl_dev_opt_t *o);

/* Queues a step of p from g (n entries each) on s at rate lr: the step count advances.
 * FL_EINVAL for a negative or non-finite lr. The caller has checked g is finite. */
int fl_dev_opt_step(fl_dev_opt_t *o, fl_stream_t *s, fl_dptr_t p, fl_dptr_t g, double lr);

/* Checkpoints: the state copied into a host optimizer of the same size and kind (synchronous
 * on s), or from one (then s's later work sees it). FL_EINVAL when they differ. */
int fl_dev_opt_save(fl_dev_opt_t *o, fl_stream_t *s, fl_opt_t *host);
int fl_dev_opt_load(fl_dev_opt_t *o, fl_stream_t *s, const fl_opt_t *host);

#ifdef __cplusplus
}
#endif

#endif
