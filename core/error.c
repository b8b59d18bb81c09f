/* Error codes and the per-thread detail text. fl_fail() sets the text where a failure happens;
 * callers pass the code up unchanged, optionally adding context with fl_fail_ctx(). */
#include "fl_core.h"

#include <stdio.h>
#include <string.h>

#define DETAIL_MAX 1024

static _Thread_local char detail[DETAIL_MAX];
/* Failures inside a cleanup (fl_error_keep_begin) write here, so detail keeps the failure that
 * made the caller clean up. */
static _Thread_local char scratch[DETAIL_MAX];
static _Thread_local int keeping;

/* Where failures write and fl_last_error reads: the scratch text while keeping. */
static char *text(void)
{
    return keeping > 0 ? scratch : detail;
}

const char *fl_strerror(int code)
{
    switch (code) {
    case FL_OK: return "success";
    case FL_EINVAL: return "invalid argument";
    case FL_ENOMEM: return "out of memory";
    case FL_EIO: return "input/output error";
    case FL_ETIMEDOUT: return "timed out";
    case FL_EPEER: return "peer failed";
    case FL_EPROTO: return "protocol error";
    case FL_EGPU: return "GPU error";
    case FL_ECLOSED: return "closed";
    case FL_ENONFINITE: return "non-finite value";
    case FL_ERESYNC: return "parameter server restarted: resynchronised";
    default: return "unknown error";
    }
}

const char *fl_last_error(void)
{
    return text();
}

void fl_error_clear(void)
{
    text()[0] = '\0';
}

void fl_error_keep_begin(void)
{
    if (keeping++ == 0)
        scratch[0] = '\0';
}

void fl_error_keep_end(void)
{
    if (keeping > 0)
        keeping--;
}

int fl_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text(), DETAIL_MAX, fmt, ap);
    va_end(ap);
    return code;
}

int fl_fail_ctx(int code, const char *fmt, ...)
{
    char old[DETAIL_MAX];
    char prefix[DETAIL_MAX / 2];
    va_list ap;

    char *out = text();
    memcpy(old, out, sizeof old);
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Truncation of an over-long detail is acceptable; the start names the operation. */
    const char *cause = old[0] != '\0' ? old : fl_strerror(code);
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    snprintf(out + n, DETAIL_MAX - n, ": %s", cause);
    return code;
}
