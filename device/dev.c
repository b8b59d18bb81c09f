/* The device front end: picks the backend, checks every call's arguments (a null address, a
 * size that overflows, a stream of another device) before anything is queued, and fills the
 * operation record the backends run. Backends own memory, streams, events and execution. */
#include "dev_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const kind_names[] = {"cpu", "sim", "cuda"};

int fl_dev_kind_parse(const char *s, fl_dev_kind_t *out)
{
    for (int i = 0; s != NULL && i < 3; i++) {
        if (strcasecmp(s, kind_names[i]) == 0) {
            *out = (fl_dev_kind_t)i;
            return FL_OK;
        }
    }
    return fl_fail(FL_EINVAL, "device '%s' is not one of cpu|sim|cuda", s ? s : "(null)");
}

const char *fl_dev_kind_name(fl_dev_kind_t kind)
{
    return (unsigned)kind < 3 ? kind_names[kind] : "unknown";
}

static const dev_backend_t *backend(fl_dev_kind_t kind)
{
    switch (kind) {
    case FL_DEV_CPU: return &fl_dev_cpu_backend;
    case FL_DEV_SIM: return &fl_dev_sim_backend;
    case FL_DEV_CUDA: return &fl_dev_cuda_backend;
    }
    return NULL;
}

int fl_dev_count(fl_dev_kind_t kind, char *why, size_t cap)
{
    if (why != NULL && cap > 0)
        why[0] = '\0';
    const dev_backend_t *be = backend(kind);
    return be != NULL ? be->count(why, cap) : 0;
}

void fl_dev_opts_init(fl_dev_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->kind = FL_DEV_CPU;
    o->mem_bytes = (size_t)16 << 30;
    o->timeout_ms = 600000;
}

int fl_dev_create(const fl_dev_opts_t *o, fl_dev_t **out)
{
    *out = NULL;
    const dev_backend_t *be = backend(o->kind);
    if (be == NULL)
        return fl_fail(FL_EINVAL, "device: kind %d is not cpu, sim or cuda", (int)o->kind);
    if (o->id < 0)
        return fl_fail(FL_EINVAL, "device %s: id %d is negative", be->name, o->id);
    if (o->timeout_ms <= 0)
        return fl_fail(FL_EINVAL, "device %s: timeout_ms %d must be positive", be->name,
                       o->timeout_ms);
    if (o->sim_jitter_us < 0 || o->sim_jitter_us > 100000)
        return fl_fail(FL_EINVAL, "device %s: sim_jitter_us %d is outside 0..100000", be->name,
                       o->sim_jitter_us);
    fl_dev_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return fl_fail(FL_ENOMEM, "device %s:%d: out of memory", be->name, o->id);
    d->be = be;
    d->o = *o;
    int rc = be->open(d);
    if (rc != FL_OK) {
        free(d);
        return rc;
    }
    *out = d;
    return FL_OK;
}

static void dev_destroy(fl_dev_t **pd)
{
    if (pd == NULL || *pd == NULL)
        return;
    (*pd)->be->close(*pd);
    free(*pd);
    *pd = NULL;
}

void fl_dev_destroy(fl_dev_t **pd)
{
    fl_error_keep_begin();
    dev_destroy(pd);
    fl_error_keep_end();
}

fl_dev_kind_t fl_dev_kind(const fl_dev_t *d)
{
    return d->o.kind;
}

int fl_dev_id(const fl_dev_t *d)
{
    return d->o.id;
}

const char *fl_dev_name(const fl_dev_t *d)
{
    return d->name;
}

int fl_dev_mem_info(fl_dev_t *d, size_t *free_bytes, size_t *total_bytes)
{
    return d->be->mem_info(d, free_bytes, total_bytes);
}

int fl_dev_bind(fl_dev_t *d)
{
    return d->be->bind(d);
}

/* ---- memory ---- */

int fl_dev_alloc(fl_dev_t *d, size_t bytes, fl_dptr_t *out)
{
    out->opaque_ = NULL;
    void *p = NULL;
    int rc = d->be->alloc(d, bytes ? bytes : 1, &p);
    if (rc == FL_OK)
        out->opaque_ = p;
    return rc;
}

void fl_dev_free(fl_dev_t *d, fl_dptr_t *p)
{
    if (p == NULL || p->opaque_ == NULL)
        return;
    d->be->free(d, p->opaque_);
    p->opaque_ = NULL;
}

int fl_dev_wrap(fl_dev_t *d, const void *host, fl_dptr_t *out)
{
    out->opaque_ = NULL;
    if (d->o.kind != FL_DEV_CPU)
        return fl_fail(FL_EINVAL, "device %s: host memory is not device memory here", d->name);
    out->opaque_ = (void *)host;
    return FL_OK;
}

int fl_dev_unwrap(fl_dev_t *d, fl_dptr_t p, void **out)
{
    *out = NULL;
    if (d->o.kind != FL_DEV_CPU)
        return fl_fail(FL_EINVAL, "device %s: device memory is not host memory here", d->name);
    *out = p.opaque_;
    return FL_OK;
}

int fl_dev_mirror(fl_dev_t *d, void *host, size_t bytes, fl_dptr_t *out)
{
    return d->o.kind == FL_DEV_CPU ? fl_dev_wrap(d, host, out) : fl_dev_alloc(d, bytes, out);
}

void fl_dev_unmirror(fl_dev_t *d, fl_dptr_t *p)
{
    if (d->o.kind == FL_DEV_CPU)
        p->opaque_ = NULL; /* the host's buffer, not ours */
    else
        fl_dev_free(d, p);
}

int fl_dev_host_register(fl_dev_t *d, void *p, size_t bytes)
{
    return d->be->host_register != NULL && p != NULL && bytes > 0
               ? d->be->host_register(d, p, bytes)
               : FL_OK;
}

void fl_dev_host_unregister(fl_dev_t *d, void *p)
{
    if (d->be->host_unregister != NULL && p != NULL)
        d->be->host_unregister(d, p);
}

int fl_dev_host_alloc(fl_dev_t *d, size_t bytes, void **out)
{
    *out = NULL;
    return d->be->host_alloc(d, bytes ? bytes : 1, out);
}

void fl_dev_host_free(fl_dev_t *d, void *p)
{
    if (p != NULL)
        d->be->host_free(d, p);
}

/* ---- streams and events ---- */

int fl_stream_create(fl_dev_t *d, fl_stream_t **out)
{
    *out = NULL;
    fl_stream_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory for a stream", d->name);
    s->d = d;
    int rc = d->be->stream_open(s);
    if (rc != FL_OK) {
        free(s);
        return rc;
    }
    *out = s;
    return FL_OK;
}

static void stream_destroy(fl_stream_t **ps)
{
    if (ps == NULL || *ps == NULL)
        return;
    (*ps)->d->be->stream_close(*ps);
    free(*ps);
    *ps = NULL;
}

void fl_stream_destroy(fl_stream_t **ps)
{
    fl_error_keep_begin();
    stream_destroy(ps);
    fl_error_keep_end();
}

fl_dev_t *fl_stream_dev(const fl_stream_t *s)
{
    return s->d;
}

int fl_stream_sync(fl_stream_t *s, int timeout_ms)
{
    return s->d->be->stream_sync(s, timeout_ms > 0 ? timeout_ms : s->d->o.timeout_ms);
}

static int event_create(fl_dev_t *d, bool timed, fl_event_t **out)
{
    *out = NULL;
    fl_event_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory for an event", d->name);
    e->d = d;
    e->timed = timed;
    e->t_ns = -1;
    int rc = d->be->event_open(e);
    if (rc != FL_OK) {
        free(e);
        return rc;
    }
    *out = e;
    return FL_OK;
}

int fl_event_create(fl_dev_t *d, fl_event_t **out)
{
    return event_create(d, false, out);
}

int fl_event_create_timed(fl_dev_t *d, fl_event_t **out)
{
    return event_create(d, true, out);
}

int fl_event_elapsed_ms(fl_event_t *start, fl_event_t *end, double *ms)
{
    *ms = 0.0;
    if (start->d != end->d)
        return fl_fail(FL_EINVAL, "device %s: elapsed time between an event of it and one of %s",
                       start->d->name, end->d->name);
    if (!start->timed || !end->timed)
        return fl_fail(FL_EINVAL,
                       "device %s: elapsed time of an event made without timing "
                       "(fl_event_create_timed)",
                       start->d->name);
    if (!start->recorded || !end->recorded)
        return fl_fail(FL_EINVAL, "device %s: elapsed time of an event never recorded",
                       start->d->name);
    return start->d->be->event_elapsed(start, end, ms);
}

static void event_destroy(fl_event_t **pe)
{
    if (pe == NULL || *pe == NULL)
        return;
    (*pe)->d->be->event_close(*pe);
    free(*pe);
    *pe = NULL;
}

void fl_event_destroy(fl_event_t **pe)
{
    fl_error_keep_begin();
    event_destroy(pe);
    fl_error_keep_end();
}

static int same_device(const fl_event_t *e, const fl_stream_t *s)
{
    if (e->d != s->d)
        return fl_fail(FL_EINVAL, "device %s: an event of %s used with its stream", s->d->name,
                       e->d->name);
    return FL_OK;
}

int fl_event_record(fl_event_t *e, fl_stream_t *s)
{
    int rc = same_device(e, s);
    if (rc == FL_OK)
        rc = s->d->be->event_record(e, s);
    if (rc == FL_OK)
        e->recorded = true;
    return rc;
}

int fl_stream_wait(fl_stream_t *s, fl_event_t *e)
{
    /* Another device's event is fine when the backend is the same one (CUDA waits across
     * devices; sim's events are the host's). */
    if (e->d->be != s->d->be)
        return fl_fail(FL_EINVAL, "device %s: a stream waits for an event of %s", s->d->name,
                       e->d->name);
    return s->d->be->stream_wait(s, e);
}

void *fl_stream_native(fl_stream_t *s)
{
    return s->d->be->stream_native != NULL ? s->d->be->stream_native(s) : NULL;
}

bool fl_event_done(fl_event_t *e)
{
    return e->d->be->event_done(e);
}

int fl_event_sync(fl_event_t *e, int timeout_ms)
{
    return e->d->be->event_sync(e, timeout_ms > 0 ? timeout_ms : e->d->o.timeout_ms);
}

/* ---- operations ---- */

/* a * b bytes, refusing overflow. */
static int bytes_of(const fl_stream_t *s, const char *what, size_t a, size_t b, size_t *out)
{
    if (b != 0 && a > SIZE_MAX / b)
        return fl_fail(FL_EINVAL, "device %s: %s: %zu x %zu bytes overflow", s->d->name, what, a,
                       b);
    *out = a * b;
    return FL_OK;
}

static void set_ptr(dev_op_t *op, int i, fl_dptr_t p, size_t ext)
{
    op->p[i] = p.opaque_;
    op->ext[i] = ext;
}

/* Checks that every address the operation needs is set, then queues it. */
static int submit(fl_stream_t *s, dev_op_t *op, unsigned required)
{
    for (int i = 0; i < DEV_NPTR; i++)
        if ((required & (1u << i)) && op->p[i] == NULL)
            return fl_fail(FL_EINVAL, "device %s: %s: address %d is null", s->d->name,
                           fl_dev_op_name(op->code), i);
    return s->d->be->run(s, op);
}

static int copy(fl_stream_t *s, dev_opcode_t code, void *dst, const void *src, size_t bytes,
                bool dst_host, bool src_host)
{
    if (bytes == 0)
        return FL_OK;
    dev_op_t op = {.code = code, .n = {bytes}};
    op.p[0] = dst;
    op.p[1] = (void *)src;
    op.ext[0] = op.ext[1] = bytes;
    op.host[0] = dst_host;
    op.host[1] = src_host;
    return submit(s, &op, 3u);
}

int fl_dev_h2d(fl_stream_t *s, fl_dptr_t dst, const void *src, size_t bytes)
{
    return copy(s, DOP_H2D, dst.opaque_, src, bytes, false, true);
}

int fl_dev_d2h(fl_stream_t *s, void *dst, fl_dptr_t src, size_t bytes)
{
    return copy(s, DOP_D2H, dst, src.opaque_, bytes, true, false);
}

int fl_dev_d2d(fl_stream_t *s, fl_dptr_t dst, fl_dptr_t src, size_t bytes)
{
    return copy(s, DOP_D2D, dst.opaque_, src.opaque_, bytes, false, false);
}

int fl_dev_peer_copy(fl_stream_t *s, fl_dptr_t dst, fl_dev_t *src_dev, fl_dptr_t src, size_t bytes)
{
    if (src_dev->be != s->d->be)
        return fl_fail(FL_EINVAL, "device %s: peer copy from %s, a device of another kind",
                       s->d->name, src_dev->name);
    if (bytes == 0)
        return FL_OK;
    dev_op_t op = {.code = DOP_PEER, .n = {bytes}, .peer = src_dev};
    set_ptr(&op, 0, dst, bytes);
    set_ptr(&op, 1, src, bytes);
    return submit(s, &op, 3u);
}

int fl_dev_memset(fl_stream_t *s, fl_dptr_t dst, int byte, size_t bytes)
{
    if (bytes == 0)
        return FL_OK;
    dev_op_t op = {.code = DOP_MEMSET, .n = {bytes}, .i0 = byte};
    set_ptr(&op, 0, dst, bytes);
    return submit(s, &op, 1u);
}

/* A GEMM's three matrices: [b, out], [out, in] and [b, in] floats, in the opcode's order. */
static int gemm(fl_stream_t *s, dev_opcode_t code, size_t b, size_t out, size_t in, fl_dptr_t p0,
                size_t e0, fl_dptr_t p1, size_t e1, fl_dptr_t p2, size_t e2, float beta)
{
    if (b == 0 || out == 0 || in == 0)
        return FL_OK;
    if (b > INT32_MAX || out > INT32_MAX || in > INT32_MAX)
        return fl_fail(FL_EINVAL, "device %s: %s of %zu x %zu x %zu: a side over 2^31", s->d->name,
                       fl_dev_op_name(code), b, out, in);
    dev_op_t op = {.code = code, .n = {b, out, in}, .f = {beta}};
    set_ptr(&op, 0, p0, e0);
    set_ptr(&op, 1, p1, e1);
    set_ptr(&op, 2, p2, e2);
    return submit(s, &op, 7u);
}

int fl_dev_gemm_fwd(fl_stream_t *s, size_t b, size_t out, size_t in, fl_dptr_t x, fl_dptr_t w,
                    float beta, fl_dptr_t z)
{
    size_t f = sizeof(float);
    return gemm(s, DOP_GEMM_FWD, b, out, in, x, b * in * f, w, out * in * f, z, b * out * f, beta);
}

int fl_dev_gemm_wgrad(fl_stream_t *s, size_t b, size_t out, size_t in, fl_dptr_t dz, fl_dptr_t a,
                      fl_dptr_t gw)
{
    size_t f = sizeof(float);
    return gemm(s, DOP_GEMM_WGRAD, b, out, in, dz, b * out * f, a, b * in * f, gw, out * in * f,
                0.0f);
}

int fl_dev_gemm_igrad(fl_stream_t *s, size_t b, size_t out, size_t in, fl_dptr_t dz, fl_dptr_t w,
                      fl_dptr_t da)
{
    size_t f = sizeof(float);
    return gemm(s, DOP_GEMM_IGRAD, b, out, in, dz, b * out * f, w, out * in * f, da, b * in * f,
                0.0f);
}

int fl_dev_bias_rows(fl_stream_t *s, fl_dptr_t z, fl_dptr_t bias, size_t rows, size_t cols)
{
    size_t bytes = 0;
    int rc = bytes_of(s, "bias rows", rows * cols, sizeof(float), &bytes);
    if (rc != FL_OK || rows == 0 || cols == 0)
        return rc;
    dev_op_t op = {.code = DOP_BIAS_ROWS, .n = {rows, cols}};
    set_ptr(&op, 0, z, bytes);
    set_ptr(&op, 1, bias, cols * sizeof(float));
    return submit(s, &op, 3u);
}

/* Elementwise operations over n floats of p0 (and p1). */
static int elementwise(fl_stream_t *s, dev_opcode_t code, fl_dptr_t p0, fl_dptr_t p1, size_t n,
                       float f0, unsigned required)
{
    size_t bytes = 0;
    int rc = bytes_of(s, fl_dev_op_name(code), n, sizeof(float), &bytes);
    if (rc != FL_OK || n == 0)
        return rc;
    dev_op_t op = {.code = code, .n = {n}, .f = {f0}};
    set_ptr(&op, 0, p0, bytes);
    set_ptr(&op, 1, p1, (required & 2u) ? bytes : 0);
    return submit(s, &op, required);
}

int fl_dev_relu(fl_stream_t *s, fl_dptr_t z, size_t n)
{
    return elementwise(s, DOP_RELU, z, fl_dptr_null(), n, 0.0f, 1u);
}

int fl_dev_relu_back(fl_stream_t *s, fl_dptr_t da, fl_dptr_t a, size_t n)
{
    return elementwise(s, DOP_RELU_BACK, da, a, n, 0.0f, 3u);
}

int fl_dev_scale(fl_stream_t *s, fl_dptr_t x, size_t n, float alpha)
{
    return elementwise(s, DOP_SCALE, x, fl_dptr_null(), n, alpha, 1u);
}

int fl_dev_axpy(fl_stream_t *s, fl_dptr_t y, fl_dptr_t x, size_t n, float alpha)
{
    return elementwise(s, DOP_AXPY, y, x, n, alpha, 3u);
}

int fl_dev_sum_rows(fl_stream_t *s, fl_dptr_t out, fl_dptr_t in, size_t cols, size_t rows,
                    float alpha)
{
    size_t bytes = 0;
    int rc = bytes_of(s, "sum of rows", rows * cols, sizeof(float), &bytes);
    if (rc == FL_OK && rows > 0 && rows * cols / rows != cols)
        rc = fl_fail(FL_EINVAL, "device %s: sum of %zu rows x %zu overflows", s->d->name, rows,
                     cols);
    if (rc != FL_OK || cols == 0)
        return rc;
    if (rows == 0)
        return fl_fail(FL_EINVAL, "device %s: sum of zero rows", s->d->name);
    dev_op_t op = {.code = DOP_SUM_ROWS, .n = {cols, rows}, .f = {alpha}};
    set_ptr(&op, 0, out, cols * sizeof(float));
    set_ptr(&op, 1, in, bytes);
    return submit(s, &op, 3u);
}

int fl_dev_bias_grad(fl_stream_t *s, fl_dptr_t gb, fl_dptr_t dz, size_t rows, size_t cols)
{
    size_t bytes = 0;
    int rc = bytes_of(s, "bias gradient", rows * cols, sizeof(float), &bytes);
    if (rc != FL_OK || cols == 0)
        return rc;
    dev_op_t op = {.code = DOP_BIAS_GRAD, .n = {rows, cols}};
    set_ptr(&op, 0, gb, cols * sizeof(float));
    set_ptr(&op, 1, dz, bytes);
    return submit(s, &op, rows > 0 ? 3u : 1u);
}

int fl_dev_xent(fl_stream_t *s, fl_dptr_t logits, fl_dptr_t labels, size_t rows, size_t classes,
                fl_dptr_t dz, fl_dptr_t row_loss, fl_dptr_t out)
{
    size_t bytes = 0;
    int rc = bytes_of(s, "cross-entropy", rows * classes, sizeof(float), &bytes);
    if (rc != FL_OK)
        return rc;
    if (rows == 0 || classes == 0)
        return fl_fail(FL_EINVAL, "device %s: cross-entropy of %zu rows x %zu classes", s->d->name,
                       rows, classes);
    dev_op_t op = {.code = DOP_XENT, .n = {rows, classes}};
    set_ptr(&op, 0, logits, bytes);
    set_ptr(&op, 1, labels, rows * sizeof(int32_t));
    set_ptr(&op, 2, dz, fl_dptr_is_null(dz) ? 0 : bytes);
    set_ptr(&op, 3, row_loss, rows * sizeof(double));
    set_ptr(&op, 4, out, 2 * sizeof(double));
    return submit(s, &op, 0x1bu);
}

int fl_dev_sumsq(fl_stream_t *s, fl_dptr_t x, size_t n, fl_dptr_t out)
{
    dev_op_t op = {.code = DOP_SUMSQ, .n = {n}};
    set_ptr(&op, 0, x, n * sizeof(float));
    set_ptr(&op, 1, out, sizeof(double));
    return submit(s, &op, n > 0 ? 3u : 2u);
}

int fl_dev_nonfinite(fl_stream_t *s, fl_dptr_t x, size_t n, fl_dptr_t out)
{
    dev_op_t op = {.code = DOP_NONFINITE, .n = {n}};
    set_ptr(&op, 0, x, n * sizeof(float));
    set_ptr(&op, 1, out, sizeof(int64_t));
    return submit(s, &op, n > 0 ? 3u : 2u);
}

int fl_dev_opt_update(fl_stream_t *s, const fl_opt_scalars_t *sc, fl_dptr_t p, fl_dptr_t g,
                      fl_dptr_t buf1, fl_dptr_t buf2, size_t n)
{
    if (n == 0)
        return FL_OK;
    size_t bytes = n * sizeof(float);
    bool adam = sc->kind != FL_OPT_SGD;
    dev_op_t op = {.code = DOP_OPT, .n = {n}, .sc = *sc};
    set_ptr(&op, 0, p, bytes);
    set_ptr(&op, 1, g, bytes);
    set_ptr(&op, 2, buf1, adam || sc->has_buf ? bytes : 0);
    set_ptr(&op, 3, buf2, adam ? bytes : 0);
    return submit(s, &op, adam ? 0xfu : sc->has_buf ? 0x7u : 0x3u);
}

int fl_dev_ef_accum(fl_stream_t *s, fl_dptr_t v, fl_dptr_t u, fl_dptr_t g, size_t n, float m,
                    float scale)
{
    if (n == 0)
        return FL_OK;
    size_t bytes = n * sizeof(float);
    dev_op_t op = {.code = DOP_EF_ACCUM, .n = {n}, .f = {m, scale}};
    set_ptr(&op, 0, v, bytes);
    set_ptr(&op, 1, u, m > 0.0f ? bytes : 0);
    set_ptr(&op, 2, g, bytes);
    return submit(s, &op, m > 0.0f ? 7u : 5u);
}

int fl_dev_ef_sent(fl_stream_t *s, fl_dptr_t v, fl_dptr_t u, fl_dptr_t idx, fl_dptr_t val, size_t k,
                   size_t n, int wire)
{
    if (k == 0)
        return FL_OK;
    if (wire != FL_WIRE_F32 && wire != FL_WIRE_F16 && wire != FL_WIRE_BF16)
        return fl_fail(FL_EINVAL, "device %s: error feedback: wire type %d", s->d->name, wire);
    dev_op_t op = {.code = DOP_EF_SENT, .n = {k, n}, .i0 = wire};
    set_ptr(&op, 0, v, n * sizeof(float));
    set_ptr(&op, 1, u, fl_dptr_is_null(u) ? 0 : n * sizeof(float));
    set_ptr(&op, 2, idx, k * sizeof(uint32_t));
    set_ptr(&op, 3, val, k * sizeof(float));
    return submit(s, &op, 0xdu);
}

/* ---- top-k ---- */

int fl_dev_topk_create(fl_dev_t *d, size_t n_max, fl_dev_topk_t **out)
{
    *out = NULL;
    if (n_max == 0 || n_max > UINT32_MAX)
        return fl_fail(FL_EINVAL, "device %s: top-k workspace for %zu entries (1..2^32-1)", d->name,
                       n_max);
    fl_dev_topk_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory for a top-k workspace", d->name);
    t->d = d;
    t->n_max = n_max;
    int rc = d->be->topk_open(t);
    if (rc != FL_OK) {
        free(t);
        return rc;
    }
    *out = t;
    return FL_OK;
}

static void dev_topk_destroy(fl_dev_topk_t **pt)
{
    if (pt == NULL || *pt == NULL)
        return;
    (*pt)->d->be->topk_close(*pt);
    free(*pt);
    *pt = NULL;
}

void fl_dev_topk_destroy(fl_dev_topk_t **pt)
{
    fl_error_keep_begin();
    dev_topk_destroy(pt);
    fl_error_keep_end();
}

int fl_dev_topk(fl_stream_t *s, fl_dev_topk_t *t, fl_dptr_t x, size_t n, size_t k, fl_dptr_t idx,
                fl_dptr_t val, fl_dptr_t out)
{
    if (t->d != s->d)
        return fl_fail(FL_EINVAL, "device %s: a top-k workspace of %s", s->d->name, t->d->name);
    if (n == 0 || n > t->n_max || k > n)
        return fl_fail(FL_EINVAL, "device %s: top-k %zu of %zu entries (workspace for %zu)",
                       s->d->name, k, n, t->n_max);
    dev_op_t op = {.code = DOP_TOPK, .n = {n, k}};
    set_ptr(&op, 0, x, n * sizeof(float));
    set_ptr(&op, 1, idx, k * sizeof(uint32_t));
    set_ptr(&op, 2, val, k * sizeof(float));
    set_ptr(&op, 3, out, 2 * sizeof(int64_t));
    op.p[4] = t->impl;
    op.host[4] = true; /* the backend's own workspace record, not checked as device memory */
    return submit(s, &op, k > 0 ? 0xfu : 0x9u);
}

const char *fl_dev_op_name(dev_opcode_t code)
{
    static const char *const names[DOP_COUNT] = {"copy to device",
                                                 "copy to host",
                                                 "device copy",
                                                 "memset",
                                                 "GEMM (forward)",
                                                 "GEMM (weight gradient)",
                                                 "GEMM (input gradient)",
                                                 "bias broadcast",
                                                 "ReLU",
                                                 "ReLU backward",
                                                 "bias gradient",
                                                 "cross-entropy",
                                                 "scale",
                                                 "axpy",
                                                 "sum of squares",
                                                 "non-finite search",
                                                 "optimizer step",
                                                 "error feedback (accumulate)",
                                                 "error feedback (sent)",
                                                 "top-k",
                                                 "device peer copy",
                                                 "sum of rows"};
    return (unsigned)code < DOP_COUNT ? names[code] : "unknown operation";
}
