/* Waiting for ZeroMQ to release zero-copy sends: a few yields first (a rank bound to one CPU
 * shares it with its ZeroMQ I/O thread, which does the release), then a futex sleep that the
 * release hook ends. Linux futexes; the timeout bounds every sleep. */
#include "release.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define YIELDS 16

void fl_rel_hook(void *data, void *hint)
{
    (void)data;
    fl_rel_t *r = hint;
    /* busy spans every touch of r: a waiter that saw the count reach zero may free r only once
     * busy is zero too (fl_rel_wait waits for that), or this hook would write freed memory. */
    atomic_fetch_add(&r->busy, 1);
    atomic_fetch_sub(&r->n, 1);
    atomic_fetch_add(&r->gen, 1);
    if (atomic_load(&r->waiters) > 0)
        syscall(SYS_futex, &r->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    atomic_fetch_sub(&r->busy, 1);
}

/* Nothing held: the hooks that released the last sends finish their few instructions. */
static bool settled(fl_rel_t *r)
{
    while (atomic_load(&r->busy) > 0)
        sched_yield();
    return true;
}

bool fl_rel_wait(fl_rel_t *r, int timeout_ms)
{
    for (int i = 0; i < YIELDS && timeout_ms > 0; i++) {
        if (fl_rel_held(r) <= 0)
            return settled(r);
        sched_yield();
    }
    if (fl_rel_held(r) <= 0)
        return settled(r);
    if (timeout_ms <= 0)
        return false;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    atomic_fetch_add(&r->waiters, 1);
    bool done = false;
    for (;;) {
        /* Read the generation before the count: a release after the count was read changes
         * the generation, so the futex does not sleep on it (or is woken: waiters is set). */
        uint32_t g = atomic_load(&r->gen);
        /* The clock before the count: a release that came by the deadline is seen by the look
         * that follows, so the wait never gives up with nothing held. */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        bool late = now.tv_sec > until.tv_sec ||
                    (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec);
        if (atomic_load(&r->n) <= 0) {
            done = true;
            break;
        }
        if (late)
            break;
        struct timespec left = {until.tv_sec - now.tv_sec, until.tv_nsec - now.tv_nsec};
        if (left.tv_nsec < 0) {
            left.tv_sec--;
            left.tv_nsec += 1000000000L;
        }
        long rc = syscall(SYS_futex, &r->gen, FUTEX_WAIT_PRIVATE, g, &left, NULL, 0);
        if (rc != 0 && errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) {
            done = atomic_load(&r->n) <= 0; /* a futex that cannot sleep: one last look */
            break;
        }
    }
    atomic_fetch_sub(&r->waiters, 1);
    return done && settled(r);
}
