/* The cpu backend: device memory is host memory, and every operation runs on the calling thread
 * when it is issued, so streams are always drained and events always complete. This is the
 * worker's CPU path: the same calls as on a GPU, with OpenBLAS and the host loops. */
#include "dev_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int count(char *why, size_t cap)
{
    (void)why;
    (void)cap;
    return 1;
}

static int open_dev(fl_dev_t *d)
{
    snprintf(d->name, sizeof d->name, "cpu");
    return FL_OK;
}

static void close_dev(fl_dev_t *d)
{
    (void)d;
}

static int mem_info(fl_dev_t *d, size_t *free_bytes, size_t *total_bytes)
{
    (void)d;
    long page = sysconf(_SC_PAGESIZE);
    long avail = sysconf(_SC_AVPHYS_PAGES);
    long total = sysconf(_SC_PHYS_PAGES);
    *free_bytes = page > 0 && avail > 0 ? (size_t)page * (size_t)avail : 0;
    *total_bytes = page > 0 && total > 0 ? (size_t)page * (size_t)total : 0;
    return FL_OK;
}

static int bind(fl_dev_t *d)
{
    (void)d;
    return FL_OK;
}

static int alloc(fl_dev_t *d, size_t bytes, void **out)
{
    /* 64-byte alignment, as cudaMalloc's 256 keeps vector loads aligned. */
    if (posix_memalign(out, 64, bytes) != 0) {
        *out = NULL;
        return fl_fail(FL_ENOMEM, "device %s: out of memory for %zu bytes", d->name, bytes);
    }
    return FL_OK;
}

static void release(fl_dev_t *d, void *p)
{
    (void)d;
    free(p);
}

static int stream_open(fl_stream_t *s)
{
    (void)s;
    return FL_OK;
}

static void stream_close(fl_stream_t *s)
{
    (void)s;
}

static int stream_sync(fl_stream_t *s, int timeout_ms)
{
    (void)s;
    (void)timeout_ms;
    return FL_OK;
}

static int event_open(fl_event_t *e)
{
    (void)e;
    return FL_OK;
}

static void event_close(fl_event_t *e)
{
    (void)e;
}

/* Every operation ran when it was issued: the record completes now. */
static int event_record(fl_event_t *e, fl_stream_t *s)
{
    (void)s;
    if (e->timed)
        e->t_ns = fl_now_ns();
    return FL_OK;
}

static int event_elapsed(fl_event_t *a, fl_event_t *b, double *ms)
{
    if (a->t_ns < 0 || b->t_ns < 0)
        return fl_fail(FL_EINVAL, "device %s: elapsed time of an event never recorded", a->d->name);
    *ms = (double)(b->t_ns - a->t_ns) / 1e6;
    return FL_OK;
}

static int stream_wait(fl_stream_t *s, fl_event_t *e)
{
    (void)s;
    (void)e;
    return FL_OK;
}

static bool event_done(fl_event_t *e)
{
    (void)e;
    return true;
}

static int event_sync(fl_event_t *e, int timeout_ms)
{
    (void)e;
    (void)timeout_ms;
    return FL_OK;
}

static int run(fl_stream_t *s, const dev_op_t *op)
{
    (void)s;
    return fl_dev_host_run(op);
}

static int topk_open(fl_dev_topk_t *t)
{
    (void)t;
    return FL_OK;
}

static void topk_close(fl_dev_topk_t *t)
{
    (void)t;
}

const dev_backend_t fl_dev_cpu_backend = {
    .name = "cpu",
    .count = count,
    .open = open_dev,
    .close = close_dev,
    .mem_info = mem_info,
    .bind = bind,
    .alloc = alloc,
    .free = release,
    .host_alloc = alloc,
    .host_free = release,
    .stream_open = stream_open,
    .stream_close = stream_close,
    .stream_sync = stream_sync,
    .event_open = event_open,
    .event_close = event_close,
    .event_record = event_record,
    .event_elapsed = event_elapsed,
    .stream_wait = stream_wait,
    .event_done = event_done,
    .event_sync = event_sync,
    .run = run,
    .topk_open = topk_open,
    .topk_close = topk_close,
};
