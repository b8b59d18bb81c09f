/* The timeline: Chrome's trace event format (a JSON array of complete events, "ph":"X", times
 * in microseconds), as Horovod's timeline writes it, readable by chrome://tracing and
 * Perfetto. Times are Unix-epoch microseconds (the monotonic clock, anchored to the wall clock
 * once at open), so the files of every rank share one origin and load together once merged
 * (flodl-trace-merge); each rank is a process ("pid": its rank) named "rank K". Events are
 * appended under a mutex as they end; the file is a valid array once closed. */
#include "fl_obs.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fl_obs_timeline {
    FILE *f;
    char path[1024];
    pthread_mutex_t mu;
    int pid;
    int64_t t0_ns;    /* the monotonic clock at open */
    double epoch0_us; /* the wall clock then, Unix-epoch microseconds */
    bool first;
    bool failed;
};

int fl_obs_timeline_open(const char *path, int pid, fl_obs_timeline_t **out)
{
    *out = NULL;
    fl_obs_timeline_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return fl_fail(FL_ENOMEM, "--timeline: out of memory");
    t->f = fopen(path, "w");
    if (t->f == NULL) {
        int e = errno;
        free(t);
        return fl_fail(FL_EIO, "--timeline: cannot write %s: %s", path, strerror(e));
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    pthread_mutex_init(&t->mu, NULL);
    t->pid = pid;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    t->t0_ns = fl_now_ns();
    t->epoch0_us = (double)wall.tv_sec * 1e6 + (double)wall.tv_nsec / 1e3;
    t->first = true;
    if (fprintf(t->f,
                "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":"
                "{\"name\":\"rank %d\"}}",
                pid, pid) < 0)
        t->failed = true;
    t->first = false;
    *out = t;
    return FL_OK;
}

/* A JSON string of a name we chose: letters, digits, spaces and a few marks only. */
static void clean(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src != NULL && src[i] && i + 1 < cap; i++) {
        char c = src[i];
        dst[i] = (c == '"' || c == '\\' || (unsigned char)c < 0x20) ? '_' : c;
    }
    dst[i] = '\0';
}

static void emit(fl_obs_timeline_t *t, const char *event)
{
    pthread_mutex_lock(&t->mu);
    if (fprintf(t->f, "%s%s", t->first ? "" : ",\n", event) < 0)
        t->failed = true;
    t->first = false;
    pthread_mutex_unlock(&t->mu);
}

void fl_obs_timeline_track(fl_obs_timeline_t *t, int tid, const char *name)
{
    if (t == NULL)
        return;
    char n[128];
    clean(n, sizeof n, name);
    char ev[256];
    snprintf(ev, sizeof ev,
             "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
             "\"%s\"}}",
             t->pid, tid, n);
    emit(t, ev);
}

void fl_obs_timeline_span(fl_obs_timeline_t *t, int tid, const char *name, const char *cat,
                          int64_t start_ns, int64_t end_ns)
{
    if (t == NULL)
        return;
    char n[96];
    char c[64];
    clean(n, sizeof n, name);
    clean(c, sizeof c, cat);
    double ts = t->epoch0_us + (double)(start_ns - t->t0_ns) / 1e3;
    double dur = (double)(end_ns - start_ns) / 1e3;
    char ev[384];
    snprintf(ev, sizeof ev,
             "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
             "\"dur\":%.3f}",
             n, c, t->pid, tid, ts, dur < 0 ? 0.0 : dur);
    emit(t, ev);
}

int fl_obs_timeline_close(fl_obs_timeline_t **pt)
{
    if (pt == NULL || *pt == NULL)
        return FL_OK;
    fl_obs_timeline_t *t = *pt;
    bool failed = t->failed || fputs("\n]\n", t->f) == EOF;
    failed = fclose(t->f) != 0 || failed;
    int rc = failed ? fl_fail(FL_EIO, "--timeline: writing %s failed", t->path) : FL_OK;
    pthread_mutex_destroy(&t->mu);
    free(t);
    *pt = NULL;
    return rc;
}
