/* The sim backend: a GPU simulated on the host, for machines without one. Device memory is an
 * arena of its own blocks, reachable only through the backend: every operation's addresses are
 * checked against the live blocks (an address outside them fails the stream, naming it). Each
 * stream is a thread that runs its queue in order, asynchronously to the host, and events order
 * the streams; so a missing event wait, or a host read before a copy ran, is a real race here:
 * wrong results in tests, and a report under ThreadSanitizer. Optional jitter before each
 * operation widens such windows. Operations run the cpu backend's host code. */
#include "dev_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct block {
    uintptr_t start;
    size_t len;
} block_t;

typedef struct sim_dev {
    pthread_mutex_t mu; /* the arena's blocks */
    block_t *blocks;    /* sorted by start */
    size_t nblocks;
    size_t cap;
    size_t used;
    long fail_seen; /* runs of o.sim_fail_op so far */
} sim_dev_t;

typedef struct sim_event {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded;  /* generation of the last record */
    uint64_t completed; /* every generation up to this one has completed */
    uint64_t *above;    /* generations past `completed` that completed out of order (records
                           on several streams); a handful at most */
    size_t nabove;
    size_t cap;
    int rc; /* the error of the stream of the last completed record */
    char err[512];
    int pending;    /* records and waits queued and not yet run (event_close waits) */
    uint64_t t_gen; /* the latest generation whose completion was timed, and when */
    int64_t t_ns;
} sim_event_t;

/* Marks generation gen completed. A wait for generation g passes once every record up to g
 * has completed: never before CUDA's would (a record on another stream may make it later). */
static void complete_gen(sim_event_t *e, uint64_t gen)
{
    if (gen <= e->completed)
        return;
    if (gen == e->completed + 1) {
        e->completed = gen;
    } else if (e->nabove < e->cap ||
               (e->above = realloc(e->above, (e->cap = e->cap * 2 + 8) * sizeof *e->above))) {
        e->above[e->nabove++] = gen;
    } else {
        e->completed = gen; /* no memory to keep it apart: complete everything below too */
        e->nabove = 0;
    }
    for (size_t i = 0; i < e->nabove;) {
        if (e->above[i] == e->completed + 1) {
            e->completed++;
            e->above[i] = e->above[--e->nabove];
            i = 0;
        } else {
            i++;
        }
    }
}

enum { Q_RUN, Q_RECORD, Q_WAIT };

typedef struct qop {
    struct qop *next;
    int kind;
    dev_op_t op;
    sim_event_t *ev;
    uint64_t gen;
} qop_t;

typedef struct sim_stream {
    fl_dev_t *d;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qop_t *head;
    qop_t *tail;
    uint64_t queued;
    uint64_t done;
    bool stop;
    int rc; /* sticky: the first failure; later operations are skipped */
    char err[512];
    uint64_t rng;
} sim_stream_t;

static int count(char *why, size_t cap)
{
    (void)why;
    (void)cap;
    return 1;
}

static int open_dev(fl_dev_t *d)
{
    sim_dev_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return fl_fail(FL_ENOMEM, "device sim:%d: out of memory", d->o.id);
    pthread_mutex_init(&m->mu, NULL);
    d->impl = m;
    snprintf(d->name, sizeof d->name, "sim:%d", d->o.id);
    return FL_OK;
}

static void close_dev(fl_dev_t *d)
{
    sim_dev_t *m = d->impl;
    for (size_t i = 0; i < m->nblocks; i++)
        free((void *)m->blocks[i].start);
    free(m->blocks);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static int mem_info(fl_dev_t *d, size_t *free_bytes, size_t *total_bytes)
{
    sim_dev_t *m = d->impl;
    pthread_mutex_lock(&m->mu);
    *total_bytes = d->o.mem_bytes;
    *free_bytes = d->o.mem_bytes - m->used;
    pthread_mutex_unlock(&m->mu);
    return FL_OK;
}

static int bind(fl_dev_t *d)
{
    (void)d;
    return FL_OK;
}

/* The first block starting above p (binary search); the block before it may hold p. */
static size_t upper(const sim_dev_t *m, uintptr_t p)
{
    size_t lo = 0;
    size_t hi = m->nblocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->blocks[mid].start <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int alloc(fl_dev_t *d, size_t bytes, void **out)
{
    sim_dev_t *m = d->impl;
    *out = NULL;
    pthread_mutex_lock(&m->mu);
    size_t free_b = d->o.mem_bytes - m->used;
    if (bytes > free_b) {
        pthread_mutex_unlock(&m->mu);
        return fl_fail(FL_ENOMEM, "device %s: out of memory: %zu bytes asked, %zu free of %zu",
                       d->name, bytes, free_b, d->o.mem_bytes);
    }
    if (m->nblocks == m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 64;
        block_t *nb = realloc(m->blocks, nc * sizeof *nb);
        if (nb == NULL) {
            pthread_mutex_unlock(&m->mu);
            return fl_fail(FL_ENOMEM, "device %s: out of host memory for the arena", d->name);
        }
        m->blocks = nb;
        m->cap = nc;
    }
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes) != 0) {
        pthread_mutex_unlock(&m->mu);
        return fl_fail(FL_ENOMEM, "device %s: no host memory for %zu bytes", d->name, bytes);
    }
    size_t at = upper(m, (uintptr_t)p);
    memmove(&m->blocks[at + 1], &m->blocks[at], (m->nblocks - at) * sizeof *m->blocks);
    m->blocks[at] = (block_t){(uintptr_t)p, bytes};
    m->nblocks++;
    m->used += bytes;
    pthread_mutex_unlock(&m->mu);
    *out = p;
    return FL_OK;
}

static void release(fl_dev_t *d, void *p)
{
    sim_dev_t *m = d->impl;
    pthread_mutex_lock(&m->mu);
    size_t at = upper(m, (uintptr_t)p);
    /* Freeing what the arena never gave is a programmer error. */
    if (at > 0 && m->blocks[at - 1].start == (uintptr_t)p) {
        m->used -= m->blocks[at - 1].len;
        memmove(&m->blocks[at - 1], &m->blocks[at], (m->nblocks - at) * sizeof *m->blocks);
        m->nblocks--;
        free(p);
    } else {
        fl_log(NULL, FL_LOG_ERROR, "device %s: free of %p, which is not device memory", d->name, p);
    }
    pthread_mutex_unlock(&m->mu);
}

static int host_alloc(fl_dev_t *d, size_t bytes, void **out)
{
    if (posix_memalign(out, 64, bytes) != 0) {
        *out = NULL;
        return fl_fail(FL_ENOMEM, "device %s: no host memory for %zu bytes", d->name, bytes);
    }
    return FL_OK;
}

static void host_free(fl_dev_t *d, void *p)
{
    (void)d;
    free(p);
}

/* Every device address of op lies, with the bytes it touches, inside one live block of its
 * device: the stream's, or for a peer copy's source the peer's. */
static int check_extents(fl_dev_t *d, const dev_op_t *op)
{
    for (int i = 0; i < DEV_NPTR; i++) {
        if (op->p[i] == NULL || op->host[i])
            continue;
        const fl_dev_t *owner = op->code == DOP_PEER && i == 1 ? op->peer : d;
        sim_dev_t *m = owner->impl;
        uintptr_t p = (uintptr_t)op->p[i];
        pthread_mutex_lock(&m->mu);
        size_t at = upper(m, p);
        const block_t *b = at > 0 ? &m->blocks[at - 1] : NULL;
        bool inside = b != NULL && p - b->start < b->len && op->ext[i] <= b->len - (p - b->start);
        pthread_mutex_unlock(&m->mu);
        if (!inside)
            return fl_fail(FL_EINVAL,
                           "device %s: %s: address %d (%p, %zu bytes) is outside "
                           "device memory%s%s",
                           d->name, fl_dev_op_name(op->code), i, op->p[i], op->ext[i],
                           owner != d ? " of " : "", owner != d ? owner->name : "");
    }
    return FL_OK;
}

static struct timespec deadline_in(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static void jitter(sim_stream_t *q)
{
    int max = q->d->o.sim_jitter_us;
    if (max <= 0)
        return;
    q->rng ^= q->rng << 13;
    q->rng ^= q->rng >> 7;
    q->rng ^= q->rng << 17;
    long us = (long)(q->rng % (uint64_t)(max + 1));
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* The fault a test asked for (fl_dev_opts_t.sim_fail_op): FL_EGPU on the chosen run of the
 * chosen operation, counted over every stream of the device. */
static int injected_fault(fl_dev_t *d, const dev_op_t *op)
{
    const char *name = fl_dev_op_name(op->code);
    if (d->o.sim_fail_op == NULL || d->o.sim_fail_after <= 0 || strcmp(name, d->o.sim_fail_op) != 0)
        return FL_OK;
    sim_dev_t *m = d->impl;
    pthread_mutex_lock(&m->mu);
    bool hit = ++m->fail_seen == d->o.sim_fail_after;
    pthread_mutex_unlock(&m->mu);
    if (!hit)
        return FL_OK;
    if (d->o.sim_stall_ms > 0) {
        /* A hung kernel: whoever waits for this stream must give up at its own deadline. */
        struct timespec ts = {d->o.sim_stall_ms / 1000, (d->o.sim_stall_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return FL_OK;
    }
    return fl_fail(FL_EGPU,
                   "device %s: %s: an illegal memory access was encountered (a fault "
                   "injected on run %ld of it)",
                   d->name, name, d->o.sim_fail_after);
}

static void fail_stream(sim_stream_t *q, int rc)
{
    if (q->rc == FL_OK) {
        q->rc = rc;
        snprintf(q->err, sizeof q->err, "%s", fl_last_error());
    }
}

/* One queued item, on the stream's thread. q->rc is written only by this thread, read by
 * others under q->mu after `done` moved. */
static void execute(sim_stream_t *q, qop_t *it)
{
    if (it->kind == Q_RUN) {
        if (q->rc != FL_OK)
            return;
        /* The jitter first: a block freed during it is then caught by the check. */
        jitter(q);
        int rc = check_extents(q->d, &it->op);
        if (rc == FL_OK)
            rc = injected_fault(q->d, &it->op);
        if (rc == FL_OK)
            rc = fl_dev_host_run(&it->op);
        if (rc != FL_OK) {
            pthread_mutex_lock(&q->mu);
            fail_stream(q, rc);
            pthread_mutex_unlock(&q->mu);
        }
    } else if (it->kind == Q_RECORD) {
        sim_event_t *e = it->ev;
        pthread_mutex_lock(&q->mu);
        int rc = q->rc;
        char err[512];
        snprintf(err, sizeof err, "%s", q->err);
        pthread_mutex_unlock(&q->mu);
        int64_t now = fl_now_ns();
        pthread_mutex_lock(&e->mu);
        complete_gen(e, it->gen);
        if (it->gen > e->t_gen) {
            e->t_gen = it->gen;
            e->t_ns = now;
        }
        e->rc = rc;
        snprintf(e->err, sizeof e->err, "%s", err);
        e->pending--;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
    } else {
        sim_event_t *e = it->ev;
        struct timespec dl = deadline_in(q->d->o.timeout_ms);
        int w = 0;
        pthread_mutex_lock(&e->mu);
        while (e->completed < it->gen && w != ETIMEDOUT)
            w = pthread_cond_timedwait(&e->cv, &e->mu, &dl);
        bool ok = e->completed >= it->gen;
        /* The recording stream's failure reaches the streams that wait for it, as a fault
         * poisons every stream of a CUDA context. */
        int erc = e->rc;
        char err[512];
        snprintf(err, sizeof err, "%s", e->err);
        e->pending--;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&q->mu);
        if (!ok)
            fail_stream(q, fl_fail(FL_ETIMEDOUT,
                                   "device %s: a stream waited %d ms for an event that never "
                                   "completed",
                                   q->d->name, q->d->o.timeout_ms));
        else if (erc != FL_OK)
            fail_stream(q, fl_fail(erc, "%s", err));
        pthread_mutex_unlock(&q->mu);
    }
}

static void *stream_main(void *arg)
{
    sim_stream_t *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->head == NULL && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->head == NULL)
            break;
        qop_t *it = q->head;
        q->head = it->next;
        if (q->head == NULL)
            q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        execute(q, it);
        free(it);
        pthread_mutex_lock(&q->mu);
        q->done++;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static int enqueue(fl_stream_t *s, int kind, const dev_op_t *op, sim_event_t *ev, uint64_t gen)
{
    sim_stream_t *q = s->impl;
    qop_t *it = calloc(1, sizeof *it);
    if (it == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory queueing an operation", s->d->name);
    it->kind = kind;
    if (op != NULL)
        it->op = *op;
    it->ev = ev;
    it->gen = gen;
    pthread_mutex_lock(&q->mu);
    if (q->tail != NULL)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->queued++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return FL_OK;
}

static int stream_open(fl_stream_t *s)
{
    sim_stream_t *q = calloc(1, sizeof *q);
    if (q == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory for a stream", s->d->name);
    q->d = s->d;
    q->rng = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)q;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->th, NULL, stream_main, q) != 0) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
        free(q);
        return fl_fail(FL_EIO, "device %s: cannot start a stream's thread", s->d->name);
    }
    s->impl = q;
    return FL_OK;
}

static int stream_sync(fl_stream_t *s, int timeout_ms)
{
    sim_stream_t *q = s->impl;
    struct timespec dl = deadline_in(timeout_ms);
    int w = 0;
    pthread_mutex_lock(&q->mu);
    uint64_t target = q->queued;
    while (q->done < target && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&q->cv, &q->mu, &dl);
    bool drained = q->done >= target;
    int rc = q->rc;
    char err[512];
    snprintf(err, sizeof err, "%s", q->err);
    pthread_mutex_unlock(&q->mu);
    if (!drained)
        return fl_fail(FL_ETIMEDOUT, "device %s: a stream's work did not finish in %d ms",
                       s->d->name, timeout_ms);
    return rc == FL_OK ? FL_OK : fl_fail(rc, "%s", err);
}

static void stream_close(fl_stream_t *s)
{
    sim_stream_t *q = s->impl;
    stream_sync(s, s->d->o.timeout_ms);
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

static int event_open(fl_event_t *e)
{
    sim_event_t *v = calloc(1, sizeof *v);
    if (v == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory for an event", e->d->name);
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->cv, NULL);
    e->impl = v;
    return FL_OK;
}

static int event_sync(fl_event_t *e, int timeout_ms)
{
    sim_event_t *v = e->impl;
    int w = 0;
    pthread_mutex_lock(&v->mu);
    uint64_t target = v->recorded;
    /* sim_late_done: the event completes within the device's bound, but only after this
     * shorter wait has given up. */
    bool late = e->d->o.sim_late_done && timeout_ms < e->d->o.timeout_ms && v->completed < target;
    struct timespec dl = deadline_in(late ? e->d->o.timeout_ms : timeout_ms);
    while (v->completed < target && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&v->cv, &v->mu, &dl);
    bool ok = v->completed >= target && !late;
    int rc = v->rc;
    char err[512];
    snprintf(err, sizeof err, "%s", v->err);
    pthread_mutex_unlock(&v->mu);
    if (!ok)
        return fl_fail(FL_ETIMEDOUT, "device %s: an event did not complete in %d ms", e->d->name,
                       timeout_ms);
    return rc == FL_OK ? FL_OK : fl_fail(rc, "%s", err);
}

static void event_close(fl_event_t *e)
{
    sim_event_t *v = e->impl;
    /* Queued records and waits (on any stream) still point at it: let them pass first. */
    struct timespec dl = deadline_in(e->d->o.timeout_ms);
    int w = 0;
    pthread_mutex_lock(&v->mu);
    while (v->pending > 0 && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&v->cv, &v->mu, &dl);
    bool idle = v->pending == 0;
    pthread_mutex_unlock(&v->mu);
    if (!idle) {
        /* Freeing it now would let a queued wait use freed memory: keep it (a leak, said). */
        fl_log(NULL, FL_LOG_ERROR, "device %s: an event destroyed with work still queued on it",
               e->d->name);
        return;
    }
    pthread_mutex_destroy(&v->mu);
    pthread_cond_destroy(&v->cv);
    free(v->above);
    free(v);
}

static int event_record(fl_event_t *e, fl_stream_t *s)
{
    sim_event_t *v = e->impl;
    pthread_mutex_lock(&v->mu);
    uint64_t gen = ++v->recorded;
    v->pending++;
    pthread_mutex_unlock(&v->mu);
    int rc = enqueue(s, Q_RECORD, NULL, v, gen);
    if (rc != FL_OK) {
        /* Never queued: complete it, so no wait hangs on it (the caller has the error). */
        pthread_mutex_lock(&v->mu);
        v->pending--;
        complete_gen(v, gen);
        pthread_cond_broadcast(&v->cv);
        pthread_mutex_unlock(&v->mu);
    }
    return rc;
}

static int stream_wait(fl_stream_t *s, fl_event_t *e)
{
    sim_event_t *v = e->impl;
    pthread_mutex_lock(&v->mu);
    uint64_t gen = v->recorded;
    v->pending += gen > 0;
    pthread_mutex_unlock(&v->mu);
    int rc = gen == 0 ? FL_OK : enqueue(s, Q_WAIT, NULL, v, gen);
    if (rc != FL_OK) {
        pthread_mutex_lock(&v->mu);
        v->pending--;
        pthread_mutex_unlock(&v->mu);
    }
    return rc;
}

static bool event_done(fl_event_t *e)
{
    sim_event_t *v = e->impl;
    pthread_mutex_lock(&v->mu);
    bool done = v->completed >= v->recorded;
    pthread_mutex_unlock(&v->mu);
    return done;
}

/* When the record reached the front of its stream, all before it done: the host clock then. */
static int record_time(fl_event_t *e, int64_t *t)
{
    sim_event_t *v = e->impl;
    pthread_mutex_lock(&v->mu);
    bool ok = v->recorded > 0 && v->completed >= v->recorded && v->t_gen == v->recorded;
    *t = v->t_ns;
    pthread_mutex_unlock(&v->mu);
    return ok ? FL_OK
              : fl_fail(FL_EINVAL,
                        "device %s: elapsed time of an event never recorded or not "
                        "completed yet",
                        e->d->name);
}

static int event_elapsed(fl_event_t *a, fl_event_t *b, double *ms)
{
    int64_t ta;
    int64_t tb;
    int rc = record_time(a, &ta);
    if (rc == FL_OK)
        rc = record_time(b, &tb);
    if (rc == FL_OK)
        *ms = (double)(tb - ta) / 1e6;
    return rc;
}

static int run(fl_stream_t *s, const dev_op_t *op)
{
    return enqueue(s, Q_RUN, op, NULL, 0);
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

const dev_backend_t fl_dev_sim_backend = {
    .name = "sim",
    .count = count,
    .open = open_dev,
    .close = close_dev,
    .mem_info = mem_info,
    .bind = bind,
    .alloc = alloc,
    .free = release,
    .host_alloc = host_alloc,
    .host_free = host_free,
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
