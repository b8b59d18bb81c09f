/* Service threads: the start, the ready and finished reports, the wait with a deadline and the
 * join that the coordinator and the parameter-server process share. How a thread is told to
 * stop (a message on its own pipe, a cancel) stays with each component. */
#include "fl_core.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

void fl_service_init(fl_service_t *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
}

void fl_service_deinit(fl_service_t *s)
{
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
}

int fl_service_start(fl_service_t *s, void *(*main_fn)(void *), void *arg, const char *what)
{
    if (s->started)
        return FL_OK;
    if (pthread_create(&s->thread, NULL, main_fn, arg) != 0)
        return fl_fail(FL_EIO, "%s: cannot start its thread", what);
    s->started = true;
    return FL_OK;
}

void fl_service_set_ready(fl_service_t *s)
{
    pthread_mutex_lock(&s->lock);
    s->ready = true;
    pthread_mutex_unlock(&s->lock);
}

bool fl_service_is_setting_up(fl_service_t *s)
{
    pthread_mutex_lock(&s->lock);
    bool setting_up = !s->ready && !s->finished;
    pthread_mutex_unlock(&s->lock);
    return setting_up;
}

void fl_service_finish(fl_service_t *s, int rc, const char *text)
{
    pthread_mutex_lock(&s->lock);
    if (!s->finished) {
        s->finished = true;
        s->result = rc;
        snprintf(s->text, sizeof s->text, "%s", text);
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
}

bool fl_service_is_finished(fl_service_t *s)
{
    pthread_mutex_lock(&s->lock);
    bool finished = s->finished;
    pthread_mutex_unlock(&s->lock);
    return finished;
}

void fl_service_text(fl_service_t *s, char *out, size_t cap)
{
    pthread_mutex_lock(&s->lock);
    snprintf(out, cap, "%s", s->text);
    pthread_mutex_unlock(&s->lock);
}

int fl_service_wait(fl_service_t *s, int timeout_ms, const char *pending)
{
    int64_t deadline = fl_deadline_in(timeout_ms);
    pthread_mutex_lock(&s->lock);
    while (!s->finished) {
        int left = fl_deadline_left_ms(deadline);
        if (left == 0)
            break;
        /* The condition variable counts on the wall clock: waiting in slices of at most 200 ms
         * keeps a jump of that clock from stretching the monotonic deadline. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int step = left > 200 ? 200 : left;
        ts.tv_nsec += (long)step * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->cond, &s->lock, &ts);
    }
    int rc = s->finished ? s->result : FL_ETIMEDOUT;
    char text[FL_SERVICE_TEXT_MAX];
    snprintf(text, sizeof text, "%s", s->finished ? s->text : pending);
    pthread_mutex_unlock(&s->lock);
    if (rc != FL_OK)
        fl_fail(rc, "%s", text);
    return rc;
}

void fl_service_stop(fl_service_t *s, void (*wake)(void *arg), void *arg)
{
    if (!s->started)
        return;
    wake(arg);
    pthread_join(s->thread, NULL);
    s->started = false;
}
