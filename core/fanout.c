/* Fan-out: n jobs at once, job j always on the same thread, the first failed job's code and
 * text collected for the caller. The threads live from create to destroy and run their jobs
 * once per run, so a caller that runs every step pays no thread start per step. What the jobs
 * do, and the deadlines of their own waits, are the caller's. */
#include "fl_core.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
    struct fl_fanout *f;
    int j;
    pthread_t th;
    bool started;
    uint64_t seen; /* the last run it took */
    int rc;
    char err[1024];
} job_t;

struct fl_fanout {
    int n;
    int first; /* jobs below it are the caller's (fl_fanout_run) */
    fl_fanout_fn fn;
    void *ud;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t run; /* runs begun */
    int finished; /* threads done with the current run */
    bool running; /* begun, not yet ended */
    bool quit;
    job_t *job; /* n */
};

static void run_job(fl_fanout_t *f, job_t *jb)
{
    jb->rc = f->fn(jb->j, f->ud);
    if (jb->rc != FL_OK)
        snprintf(jb->err, sizeof jb->err, "%s", fl_last_error());
}

static void *job_main(void *arg)
{
    job_t *jb = arg;
    fl_fanout_t *f = jb->f;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        /* Idle between runs: no deadline, destroy ends it. */
        while (jb->seen == f->run && !f->quit)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->quit)
            break;
        jb->seen = f->run;
        pthread_mutex_unlock(&f->mu);
        run_job(f, jb);
        pthread_mutex_lock(&f->mu);
        f->finished++;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int fl_fanout_create(int n, int first, fl_fanout_fn fn, void *ud, const char *what,
                     fl_fanout_t **out)
{
    assert(n >= 1 && (first == 0 || first == 1) && fn != NULL);
    *out = NULL;
    fl_fanout_t *f = calloc(1, sizeof *f);
    job_t *job = calloc((size_t)n, sizeof *job);
    if (f == NULL || job == NULL) {
        free(f);
        free(job);
        return fl_fail(FL_ENOMEM, "%s: out of memory for %d threads", what, n);
    }
    f->n = n;
    f->first = first;
    f->fn = fn;
    f->ud = ud;
    f->job = job;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    for (int j = 0; j < n; j++) {
        job[j].f = f;
        job[j].j = j;
    }
    for (int j = first; j < n; j++) {
        int e = pthread_create(&job[j].th, NULL, job_main, &job[j]);
        if (e != 0) {
            fl_fanout_destroy(&f);
            return fl_fail(FL_EIO, "%s: cannot start the thread of job %d of %d: %s", what, j, n,
                           strerror(e));
        }
        job[j].started = true;
    }
    *out = f;
    return FL_OK;
}

static void fanout_destroy(fl_fanout_t **pf)
{
    if (pf == NULL || *pf == NULL)
        return;
    fl_fanout_t *f = *pf;
    pthread_mutex_lock(&f->mu);
    f->quit = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    /* A job of a run not ended finishes it first: the join waits as long as its own deadlines. */
    for (int j = 0; j < f->n; j++)
        if (f->job[j].started)
            pthread_join(f->job[j].th, NULL);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f->job);
    free(f);
    *pf = NULL;
}

void fl_fanout_destroy(fl_fanout_t **pf)
{
    fl_error_keep_begin();
    fanout_destroy(pf);
    fl_error_keep_end();
}

void fl_fanout_begin(fl_fanout_t *f)
{
    pthread_mutex_lock(&f->mu);
    assert(!f->running);
    f->running = true;
    f->run++;
    f->finished = 0;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Called locked. */
static bool all_finished(const fl_fanout_t *f)
{
    return f->finished >= f->n - f->first;
}

bool fl_fanout_poll(fl_fanout_t *f, int timeout_ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    int64_t ns = dl.tv_nsec + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
    dl.tv_sec += (time_t)(ns / 1000000000);
    dl.tv_nsec = (long)(ns % 1000000000);
    pthread_mutex_lock(&f->mu);
    while (!all_finished(f) && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&f->cv, &f->mu);
        else if (pthread_cond_timedwait(&f->cv, &f->mu, &dl) != 0)
            break; /* the deadline: all_finished is asked again below */
    }
    bool done = all_finished(f);
    pthread_mutex_unlock(&f->mu);
    return done;
}

/* The lowest failed job from `from` on: its code, its text in fl_last_error. */
static int first_error(const fl_fanout_t *f, int from)
{
    for (int j = from; j < f->n; j++)
        if (f->job[j].rc != FL_OK)
            return fl_fail(f->job[j].rc, "%s", f->job[j].err);
    return FL_OK;
}

/* Waits until every thread finished the run (as long as the jobs' own deadlines). */
static void finish(fl_fanout_t *f)
{
    fl_fanout_poll(f, -1);
    pthread_mutex_lock(&f->mu);
    f->running = false;
    pthread_mutex_unlock(&f->mu);
}

int fl_fanout_end(fl_fanout_t *f)
{
    finish(f);
    return first_error(f, f->first);
}

int fl_fanout_run(fl_fanout_t *f)
{
    fl_fanout_begin(f);
    if (f->first == 1)
        run_job(f, &f->job[0]);
    finish(f);
    return first_error(f, 0);
}

int fl_fanout_once(int n, fl_fanout_fn fn, void *ud, const char *what)
{
    fl_fanout_t *f = NULL;
    int rc = fl_fanout_create(n, 0, fn, ud, what, &f);
    if (rc != FL_OK)
        return rc;
    rc = fl_fanout_run(f);
    fl_fanout_destroy(&f);
    return rc;
}
