/* The cuda backend: a GPU through the CUDA runtime. This file owns devices, memory, streams
 * and events, and fills the backend table; the operations (copies, cuBLAS, kernels) are in
 * dev_cuda_ops.cu and top-k in dev_cuda_topk.cu. Stream and event waits poll up to a deadline
 * instead of blocking in a synchronise; every CUDA failure becomes FL_EGPU naming the device. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dev_cuda_int.h"

/* A device: its kits of stream resources kept for reuse. */
typedef struct cuda_dev {
    pthread_mutex_t mu;
    cuda_stream_t *idle;    /* records of destroyed streams, ready for the next */
    cuda_stream_t *retired; /* records of streams that did not drain: freed with the device */
} cuda_dev_t;

extern "C" bool fl_dev_cuda_built(void)
{
    return true;
}

int fl_dev_cuda_fail(const fl_dev_t *d, const char *what, cudaError_t e)
{
    cudaGetLastError();
    return fl_fail(FL_EGPU, "device %s: %s: %s", d->name, what, cudaGetErrorString(e));
}

/* The device current for the calling thread: cheap when it already is. */
static int use(const fl_dev_t *d, const char *what)
{
    cudaError_t e = cudaSetDevice(d->o.id);
    return e == cudaSuccess ? FL_OK : fl_dev_cuda_fail(d, what, e);
}

static int count(char *why, size_t cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* sticky for this thread otherwise */
        if (why != NULL && cap > 0)
            snprintf(why, cap, "no usable CUDA driver: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why != NULL && cap > 0)
        snprintf(why, cap, "no CUDA device");
    return n;
}

static int open_dev(fl_dev_t *d)
{
    int id = d->o.id;
    char why[256] = "";
    int n = count(why, sizeof why);
    if (n == 0)
        return fl_fail(FL_EGPU, "device cuda:%d: %s", id, why);
    if (id >= n)
        return fl_fail(FL_EINVAL, "device cuda:%d: id out of range, this host has %d GPU(s)", id,
                       n);
    snprintf(d->name, sizeof d->name, "cuda:%d", id);
    cudaDeviceProp p;
    cudaError_t e = cudaSetDevice(id);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&p, id);
    if (e != cudaSuccess)
        return fl_dev_cuda_fail(d, "open", e);
    cuda_dev_t *m = (cuda_dev_t *)calloc(1, sizeof *m);
    if (m == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory", d->name);
    pthread_mutex_init(&m->mu, NULL);
    d->impl = m;
    snprintf(d->name, sizeof d->name, "cuda:%d (%.120s)", id, p.name);
    return FL_OK;
}

static void kit_destroy(cuda_stream_t *q)
{
    if (q->blas != NULL)
        cublasDestroy(q->blas);
    cudaFree(q->part);
    free(q);
}

/* The streams are gone (the front end's contract): their kits are freed here, where the
 * device-wide synchronisation that cublasDestroy and cudaFree imply costs nothing. */
static void close_dev(fl_dev_t *d)
{
    cuda_dev_t *m = (cuda_dev_t *)d->impl;
    cudaSetDevice(d->o.id);
    cuda_stream_t *lists[2] = {m->idle, m->retired};
    for (int l = 0; l < 2; l++) {
        while (lists[l] != NULL) {
            cuda_stream_t *q = lists[l];
            lists[l] = q->next;
            kit_destroy(q);
        }
    }
    cudaGetLastError();
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static int mem_info(fl_dev_t *d, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = 0;
    *total_bytes = 0;
    int rc = use(d, "memory info");
    if (rc != FL_OK)
        return rc;
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    return e == cudaSuccess ? FL_OK : fl_dev_cuda_fail(d, "memory info", e);
}

static int bind_dev(fl_dev_t *d)
{
    return use(d, "bind");
}

static int alloc(fl_dev_t *d, size_t bytes, void **out)
{
    *out = NULL;
    int rc = use(d, "allocate");
    if (rc != FL_OK)
        return rc;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaSuccess)
        return FL_OK;
    *out = NULL;
    cudaGetLastError();
    size_t fr = 0;
    size_t tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
        cudaGetLastError();
    return fl_fail(FL_ENOMEM, "device %s: out of memory: %zu bytes asked, %zu free of %zu (%s)",
                   d->name, bytes, fr, tot, cudaGetErrorString(e));
}

static void release(fl_dev_t *d, void *p)
{
    if (use(d, "free") == FL_OK && cudaFree(p) != cudaSuccess)
        cudaGetLastError();
}

static int host_alloc(fl_dev_t *d, size_t bytes, void **out)
{
    *out = NULL;
    cudaError_t e = cudaMallocHost(out, bytes);
    if (e == cudaSuccess)
        return FL_OK;
    *out = NULL;
    cudaGetLastError();
    return fl_fail(FL_ENOMEM, "device %s: no page-locked host memory for %zu bytes: %s", d->name,
                   bytes, cudaGetErrorString(e));
}

static void host_free(fl_dev_t *d, void *p)
{
    (void)d;
    if (cudaFreeHost(p) != cudaSuccess)
        cudaGetLastError();
}

static int host_register(fl_dev_t *d, void *p, size_t bytes)
{
    /* Portable: page-locked for every device's context (others read device 0's gradient). */
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e == cudaSuccess)
        return FL_OK;
    cudaGetLastError();
    return fl_fail(FL_EGPU, "device %s: page-locking %zu bytes of host memory: %s", d->name, bytes,
                   cudaGetErrorString(e));
}

static void host_unregister(fl_dev_t *d, void *p)
{
    (void)d;
    if (cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();
}

/* ---- streams ---- */

/* A kit from the device's idle list, or a new one with its reduction scratch. */
static int kit_take(fl_dev_t *d, cuda_stream_t **out)
{
    cuda_dev_t *m = (cuda_dev_t *)d->impl;
    pthread_mutex_lock(&m->mu);
    cuda_stream_t *q = m->idle;
    if (q != NULL)
        m->idle = q->next;
    pthread_mutex_unlock(&m->mu);
    if (q == NULL) {
        q = (cuda_stream_t *)calloc(1, sizeof *q);
        if (q == NULL)
            return fl_fail(FL_ENOMEM, "device %s: out of memory for a stream", d->name);
        cudaError_t e = cudaMalloc(&q->part, FL_CUDA_RED_GRID * sizeof(double));
        if (e != cudaSuccess) {
            free(q);
            return fl_dev_cuda_fail(d, "stream scratch", e);
        }
    }
    q->next = NULL;
    *out = q;
    return FL_OK;
}

static void kit_give(fl_dev_t *d, cuda_stream_t *q, bool drained)
{
    cuda_dev_t *m = (cuda_dev_t *)d->impl;
    pthread_mutex_lock(&m->mu);
    cuda_stream_t **list = drained ? &m->idle : &m->retired;
    q->next = *list;
    *list = q;
    pthread_mutex_unlock(&m->mu);
}

static int stream_open(fl_stream_t *s)
{
    fl_dev_t *d = s->d;
    int rc = use(d, "stream create");
    cuda_stream_t *q = NULL;
    if (rc != FL_OK || (rc = kit_take(d, &q)) != FL_OK)
        return rc;
    cudaError_t e = cudaStreamCreateWithFlags(&q->st, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        kit_give(d, q, true);
        return fl_dev_cuda_fail(d, "stream create", e);
    }
    if (q->blas != NULL) {
        cublasStatus_t b = cublasSetStream(q->blas, q->st);
        if (b != CUBLAS_STATUS_SUCCESS) {
            cudaStreamDestroy(q->st);
            kit_give(d, q, true);
            return fl_fail(FL_EGPU, "device %s: stream create: cuBLAS: %s", d->name,
                           cublasGetStatusName(b));
        }
    }
    s->impl = q;
    return FL_OK;
}

/* Polls query() until it is done or timeout_ms passed (the policy below: a step's waits end
 * within microseconds of the work, long ones cost little CPU). */
template <typename Q>
static int bounded_wait(const fl_dev_t *d, const char *what, int timeout_ms, Q query)
{
    int64_t t0 = fl_now_ns();
    int64_t deadline = t0 + (int64_t)timeout_ms * 1000000;
    for (;;) {
        cudaError_t e = query();
        if (e == cudaSuccess)
            return FL_OK;
        if (e != cudaErrorNotReady)
            return fl_dev_cuda_fail(d, what, e);
        cudaGetLastError(); /* "not ready" is no error: keep it off later launch checks */
        int64_t now = fl_now_ns();
        if (now >= deadline)
            return fl_fail(FL_ETIMEDOUT, "device %s: %s: not done in %d ms", d->name, what,
                           timeout_ms);
        /* A step's waits last milliseconds: a sleep that doubled up to 1 ms overslept each by
         * up to a millisecond (a quarter of a step on an H200). So the wait polls (yielding
         * the core) for its first 5 ms, as CUDA's own spin wait does, then sleeps 20 us, and
         * only past 100 ms backs off to 1 ms, where that is 1% at most. */
        int64_t waited = now - t0;
        if (waited < 5000000) {
            sched_yield();
            continue;
        }
        long pause_us = waited < 100000000 ? 20 : 1000;
        struct timespec ts = {0, pause_us * 1000L};
        nanosleep(&ts, NULL);
    }
}

static int stream_sync(fl_stream_t *s, int timeout_ms)
{
    cudaStream_t st = fl_dev_cuda_stream(s)->st;
    return bounded_wait(s->d, "stream synchronize", timeout_ms,
                        [st]() { return cudaStreamQuery(st); });
}

static void stream_close(fl_stream_t *s)
{
    cuda_stream_t *q = fl_dev_cuda_stream(s);
    /* Queued work finishes even after cudaStreamDestroy, but the kit's scratch and handle
     * may serve another stream only once nothing queued here can still use them. */
    use(s->d, "stream destroy");
    bool drained = stream_sync(s, s->d->o.timeout_ms) == FL_OK;
    cudaStreamDestroy(q->st);
    cudaGetLastError();
    q->st = NULL;
    kit_give(s->d, q, drained);
    s->impl = NULL;
}

static cublasMath_t blas_math_mode(void)
{
    const char *m = getenv("FLODL_CUBLAS_MATH");
    return m != NULL && strcmp(m, "pedantic") == 0 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH;
}

int fl_dev_cuda_blas(fl_stream_t *s, cublasHandle_t *out)
{
    cuda_stream_t *q = fl_dev_cuda_stream(s);
    if (q->blas == NULL) {
        cublasHandle_t h = NULL;
        cublasStatus_t b = cublasCreate(&h);
        /* float32 throughout, never TF32 tensor cores (PyTorch's default since 1.12, whose
         * allow_tf32=False is this mode); FLODL_CUBLAS_MATH=pedantic asks for cuBLAS's
         * standardized arithmetic instead (for numerical studies: slower). */
        if (b == CUBLAS_STATUS_SUCCESS)
            b = cublasSetMathMode(h, blas_math_mode());
        if (b == CUBLAS_STATUS_SUCCESS)
            b = cublasSetStream(h, q->st);
        if (b != CUBLAS_STATUS_SUCCESS) {
            if (h != NULL)
                cublasDestroy(h);
            return fl_fail(FL_EGPU, "device %s: cuBLAS handle: %s", s->d->name,
                           cublasGetStatusName(b));
        }
        q->blas = h;
    }
    *out = q->blas;
    return FL_OK;
}

/* ---- events: a cudaEvent_t is the impl itself ---- */

static cudaEvent_t ev(const fl_event_t *e)
{
    return (cudaEvent_t)e->impl;
}

static int event_open(fl_event_t *e)
{
    int rc = use(e->d, "event create");
    if (rc != FL_OK)
        return rc;
    cudaEvent_t v = NULL;
    cudaError_t c =
        cudaEventCreateWithFlags(&v, e->timed ? cudaEventDefault : cudaEventDisableTiming);
    if (c != cudaSuccess)
        return fl_dev_cuda_fail(e->d, "event create", c);
    e->impl = v;
    return FL_OK;
}

/* CUDA releases a recorded event's resources once it completes, so nothing waits here. */
static void event_close(fl_event_t *e)
{
    if (cudaEventDestroy(ev(e)) != cudaSuccess)
        cudaGetLastError();
    e->impl = NULL;
}

static int event_record(fl_event_t *e, fl_stream_t *s)
{
    cudaError_t c = cudaEventRecord(ev(e), fl_dev_cuda_stream(s)->st);
    return c == cudaSuccess ? FL_OK : fl_dev_cuda_fail(s->d, "event record", c);
}

static int stream_wait(fl_stream_t *s, fl_event_t *e)
{
    cudaError_t c = cudaStreamWaitEvent(fl_dev_cuda_stream(s)->st, ev(e), 0);
    return c == cudaSuccess ? FL_OK : fl_dev_cuda_fail(s->d, "stream wait", c);
}

/* CUDA's answer: a never-recorded event counts as complete. */
static bool event_done(fl_event_t *e)
{
    cudaError_t c = cudaEventQuery(ev(e));
    if (c != cudaSuccess)
        cudaGetLastError();
    return c == cudaSuccess;
}

static int event_sync(fl_event_t *e, int timeout_ms)
{
    cudaEvent_t v = ev(e);
    return bounded_wait(e->d, "event synchronize", timeout_ms, [v]() { return cudaEventQuery(v); });
}

static int event_elapsed(fl_event_t *a, fl_event_t *b, double *ms)
{
    float f = 0.0f;
    cudaError_t c = cudaEventElapsedTime(&f, ev(a), ev(b));
    if (c != cudaSuccess) {
        /* Not ready or never recorded: the caller's mistake, not a broken device. */
        if (c == cudaErrorNotReady || c == cudaErrorInvalidResourceHandle) {
            cudaGetLastError();
            return fl_fail(FL_EINVAL, "device %s: elapsed time: %s", a->d->name,
                           cudaGetErrorString(c));
        }
        return fl_dev_cuda_fail(a->d, "event elapsed time", c);
    }
    *ms = (double)f;
    return FL_OK;
}

static void *stream_native(fl_stream_t *s)
{
    return (void *)fl_dev_cuda_stream(s)->st;
}

/* Positional (C++17 has no designated initializers), in dev_backend_t's order. */
extern "C" const dev_backend_t fl_dev_cuda_backend = {
    "cuda",
    count,
    open_dev,
    close_dev,
    mem_info,
    bind_dev,
    alloc,
    release,
    host_alloc,
    host_free,
    stream_open,
    stream_close,
    stream_sync,
    event_open,
    event_close,
    event_record,
    stream_wait,
    event_done,
    event_sync,
    fl_dev_cuda_run,
    fl_dev_cuda_topk_open,
    fl_dev_cuda_topk_close,
    host_register,
    host_unregister,
    stream_native,
    event_elapsed,
};
