/* Rate-limited warnings: the first `burst` lines of a window pass, the rest are counted and
 * summed up in one line when the window ends, so a peer sending a thousand bad messages gives
 * a few lines and a count rather than a thousand lines. A ratelog says one line per period and
 * names the count in the next line said instead. Owned by one thread (the caller locks
 * otherwise). */
#include "fl_core.h"

#include <stdio.h>
#include <string.h>

void fl_ratelimit_init(fl_ratelimit_t *r, int burst, int window_ms)
{
    memset(r, 0, sizeof *r);
    r->burst = burst > 0 ? burst : 1;
    r->window_ms = window_ms > 0 ? window_ms : 1000;
}

uint64_t fl_ratelimit_flush(fl_ratelimit_t *r, int64_t now_ms)
{
    if (r->start_ms == 0 || now_ms - r->start_ms < r->window_ms)
        return 0;
    uint64_t held = r->held;
    r->start_ms = 0;
    r->passed = 0;
    r->held = 0;
    return held;
}

bool fl_ratelimit_allow(fl_ratelimit_t *r, int64_t now_ms, uint64_t *held)
{
    *held = fl_ratelimit_flush(r, now_ms);
    if (r->start_ms == 0)
        r->start_ms = now_ms;
    if (r->passed < (uint64_t)r->burst) {
        r->passed++;
        return true;
    }
    r->held++;
    return false;
}

bool fl_ratelog_say(fl_ratelog_t *r, int64_t now_ms, int every_ms, char *more, size_t cap)
{
    if (now_ms < r->next_ms) {
        r->quiet++;
        return false;
    }
    if (cap > 0)
        more[0] = '\0';
    if (r->quiet > 0)
        snprintf(more, cap, "; %llu more since the last report", (unsigned long long)r->quiet);
    r->quiet = 0;
    r->next_ms = now_ms + every_ms;
    return true;
}
