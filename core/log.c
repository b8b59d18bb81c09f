/* Logging: one line per call, "[time prefix] LEVEL: text", written with a single write(2) so
 * that lines of several threads and processes sharing stderr never interleave. */
#include "ctx_int.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <strings.h>
#include <unistd.h>

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

const char *fl_log_level_name(fl_log_level_t level)
{
    if (level < FL_LOG_DEBUG || level > FL_LOG_OFF)
        return "unknown";
    return level_names[level];
}

int fl_log_level_parse(const char *s, fl_log_level_t *out)
{
    if (s == NULL)
        return fl_fail(FL_EINVAL, "log level: missing value");
    for (int i = FL_LOG_DEBUG; i <= FL_LOG_OFF; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (fl_log_level_t)i;
            return FL_OK;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = FL_LOG_WARN;
        return FL_OK;
    }
    return fl_fail(FL_EINVAL, "log level '%s' is not one of debug|info|warn|error|off", s);
}

void fl_vlog(const fl_ctx_t *ctx, fl_log_level_t level, const char *fmt, va_list ap)
{
    fl_log_level_t min = ctx ? fl_ctx_log_level(ctx) : FL_LOG_WARN;
    if (level < min || level >= FL_LOG_OFF)
        return;

    char line[2048];
    char name[LOG_NAME_MAX];
    if (ctx != NULL) {
        fl_ctx_t *c = (fl_ctx_t *)ctx;
        pthread_mutex_lock(&c->name_lock);
        memcpy(name, c->log_name, sizeof name);
        pthread_mutex_unlock(&c->name_lock);
    } else {
        snprintf(name, sizeof name, "flodl");
    }
    /* Wall-clock time, ISO 8601 in UTC with milliseconds: lines from every host merge. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t w0 = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + w0, sizeof when - w0, ".%03ldZ", ts.tv_nsec / 1000000L);
    int n = snprintf(line, sizeof line, "[%s %s] %s: ", when, name, level_names[level]);
    if (n < 0)
        return;
    if ((size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if ((size_t)n >= sizeof line - 1)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

void fl_log(const fl_ctx_t *ctx, fl_log_level_t level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fl_vlog(ctx, level, fmt, ap);
    va_end(ap);
}
