/* Monotonic clock and deadlines. Every blocking wait in flodl converts its timeout into an
 * absolute deadline once, so retries and loops never extend it. */
#include "fl_core.h"

#include <stdint.h>
#include <time.h>

int64_t fl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t fl_now_ms(void)
{
    return fl_now_ns() / 1000000LL;
}

int64_t fl_deadline_in(int timeout_ms)
{
    if (timeout_ms < 0)
        return INT64_MAX;
    return fl_now_ms() + timeout_ms;
}

int fl_deadline_left_ms(int64_t deadline_ms)
{
    if (deadline_ms == INT64_MAX)
        return INT32_MAX;
    int64_t now = fl_now_ms();
    if (deadline_ms <= now)
        return 0;
    int64_t left = deadline_ms - now;
    if (left > INT32_MAX)
        return INT32_MAX;
    return (int)left;
}
