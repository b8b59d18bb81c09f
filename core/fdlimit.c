/* The process's limit on open files (RLIMIT_NOFILE): the binaries raise the soft limit to the
 * hard one at start, since a server holds a descriptor per connection, and the transport reads
 * it to warn when the process nears it. Raising beyond the hard limit is the operator's. */
#include "fl_core.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

/* Below this a server of a few hundred ranks runs short: said at warn level. */
#define FEW_FILES 4096

int fl_fdlimit_raise(fl_fdlimit_t *out)
{
    memset(out, 0, sizeof *out);
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0)
        return fl_fail(FL_EIO, "open files: getrlimit: %s", strerror(errno));
    out->before = (uint64_t)r.rlim_cur;
    out->hard = (uint64_t)r.rlim_max;
    out->soft = out->before;
    if (r.rlim_cur == r.rlim_max)
        return FL_OK;
    struct rlimit want = {r.rlim_max, r.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &want) != 0)
        return fl_fail(FL_EIO,
                       "open files: cannot raise the soft limit %llu to the hard limit "
                       "%llu: %s",
                       (unsigned long long)r.rlim_cur, (unsigned long long)r.rlim_max,
                       strerror(errno));
    out->soft = out->hard;
    return FL_OK;
}

uint64_t fl_fdlimit_soft(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return (uint64_t)r.rlim_cur;
}

void fl_fdlimit_start(const char *prog, fl_log_level_t level)
{
    fl_fdlimit_t l;
    if (fl_fdlimit_raise(&l) != FL_OK) {
        fprintf(stderr, "%s: %s\n", prog, fl_last_error());
        return;
    }
    bool few = l.soft < FEW_FILES;
    if (level > FL_LOG_INFO && !(few && level <= FL_LOG_WARN))
        return;
    if (l.soft != l.before)
        fprintf(stderr, "%s: open files: soft limit %llu raised to the hard limit %llu%s\n", prog,
                (unsigned long long)l.before, (unsigned long long)l.hard,
                few ? " (low: each connection takes one; raise the hard limit, e.g. "
                      "LimitNOFILE or ulimit -Hn)"
                    : "");
    else
        fprintf(stderr, "%s: open files: soft limit %llu, hard limit %llu%s\n", prog,
                (unsigned long long)l.soft, (unsigned long long)l.hard,
                few ? " (low: each connection takes one; raise the hard limit, e.g. "
                      "LimitNOFILE or ulimit -Hn)"
                    : "");
}
