/* Private to collective/: a count of zero-copy sends ZeroMQ still holds, and a wait for it to
 * reach zero that sleeps on a futex the release hook wakes, instead of polling with sleeps (a
 * usleep(50) costs ~120 us with the default timer slack, more than a small collective). */
#ifndef FL_RELEASE_H
#define FL_RELEASE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct fl_rel {
    _Atomic int64_t n;        /* sends not yet released */
    _Atomic uint32_t gen;     /* bumped by every release: the futex word */
    _Atomic uint32_t waiters; /* threads in fl_rel_wait: the hook wakes only when set */
    _Atomic uint32_t busy;    /* hooks between their first and last touch of this struct */
} fl_rel_t;

/* Counts k more sends (before handing them to ZeroMQ). */
static inline void fl_rel_add(fl_rel_t *r, int64_t k)
{
    atomic_fetch_add_explicit(&r->n, k, memory_order_relaxed);
}

static inline int64_t fl_rel_held(fl_rel_t *r)
{
    return atomic_load_explicit(&r->n, memory_order_acquire);
}

/* The fl_buf_t release hook (hint: the fl_rel_t); runs in ZeroMQ's I/O thread. */
void fl_rel_hook(void *data, void *hint);

/* Waits until nothing is held or timeout_ms passes (0: only looks). True when nothing is held
 * and no release hook is still touching r: the caller may then free it. Any number of threads
 * may wait. */
bool fl_rel_wait(fl_rel_t *r, int timeout_ms);

#endif
