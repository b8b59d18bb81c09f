/* The guard's memory checks (tp_guard.c runs them on its thread): a connection holding more
 * than the bound of one connection is closed; past the process's bound over every guard of the
 * context (tp_hold.c), this guard's largest holders go first. */
#include "tp_guard_int.h"

#include <arpa/inet.h>
#include <stdatomic.h>
#include <stdio.h>

/* The connection holding most of this guard's, or NULL when none holds anything. */
static conn_t *largest(fl_tp_guard_t *g, int *fd)
{
    conn_t *pick = NULL;
    for (size_t i = 0; i < g->nlive; i++) {
        conn_t *c = fl_tp_guard_conn(g, g->live[i]);
        if (c->state != CLOSING && c->hold.held > (pick != NULL ? pick->hold.held : 0)) {
            pick = c;
            *fd = g->live[i];
        }
    }
    return pick;
}

/* The process's bound, over the guards of one context together (tp_hold.c): past it this
 * guard's largest holders go first, until the total is back under. */
static void process_bound(fl_tp_guard_t *g, int64_t now)
{
    uint64_t mine = 0;
    for (size_t i = 0; i < g->nlive; i++) {
        conn_t *c = fl_tp_guard_conn(g, g->live[i]);
        mine += c->state != CLOSING ? c->hold.held : 0;
    }
    uint64_t total = fl_ctx_held_add(g->ctx, (int64_t)(mine - g->held));
    g->held = mine;
    int fd = -1;
    conn_t *c;
    while (fl_tp_hold_over(g->ctx, total) && (c = largest(g, &fd)) != NULL) {
        uint64_t held = c->hold.held;
        char ip[INET6_ADDRSTRLEN + 32];
        fl_tp_guard_addr(c, ip, sizeof ip);
        if (fl_tp_guard_reset(g, fd, c)) {
            c->state = CLOSING;
            c->held_too_much = true;
            fl_tp_hold_cut_said(g->ctx, g->name, ip, held, total, now, &g->log_process);
        }
        c->hold.held = 0; /* cut, or gone meanwhile: either way not this guard's any more */
        total = fl_ctx_held_add(g->ctx, -(int64_t)held);
        g->held -= held;
    }
}

bool fl_tp_guard_holds(const fl_tp_guard_t *g)
{
    return g->hold_max > 0 || fl_ctx_held_max(g->ctx) > 0;
}

/* Growth of the process that makes the guard read every connection's counters at once: a
 * quarter of the smaller bound. */
static uint64_t scan_step(const fl_tp_guard_t *g)
{
    uint64_t process = fl_ctx_held_max(g->ctx);
    uint64_t bound = g->hold_max == 0                        ? process
                     : process == 0 || g->hold_max < process ? g->hold_max
                                                             : process;
    return bound / 4;
}

void fl_tp_guard_hold_check(fl_tp_guard_t *g, int64_t now)
{
    uint64_t rss = fl_tp_hold_rss(g->statm);
    /* Every connection's counters cost two system calls: read them when the process grew by a
     * quarter of a bound, and once a second. */
    if (now - g->scan_ms < SCAN_EVERY_MS && rss < g->scan_rss + scan_step(g))
        return;
    g->scan_ms = now;
    g->scan_rss = rss;
    for (size_t i = 0; i < g->nlive; i++) {
        int fd = g->live[i];
        conn_t *c = fl_tp_guard_conn(g, fd);
        chunk_t *k = fl_tp_guard_chunk(g, fd);
        uint64_t pulled;
        if (c->state == CLOSING || fl_tp_hold_pulled(fd, &pulled) != FL_OK)
            continue;
        uint64_t held =
            fl_tp_hold_update(&c->hold, pulled,
                              atomic_load_explicit(&k->bytes[fd % CHUNK], memory_order_relaxed),
                              atomic_load_explicit(&k->frames[fd % CHUNK], memory_order_relaxed),
                              now);
        if (g->hold_max == 0 || held <= g->hold_max || !fl_tp_guard_reset(g, fd, c))
            continue;
        if (c->state == PENDING)
            g->npending--;
        c->state = CLOSING;
        c->held_too_much = true;
        fl_ctx_count(g->ctx, FL_STAT_OVERSIZED, 1);
        char more[64];
        if (fl_ratelog_say(&g->log_hold, now, FL_TP_LOG_EVERY_MS, more, sizeof more)) {
            char ip[INET6_ADDRSTRLEN + 32];
            fl_tp_guard_addr(c, ip, sizeof ip);
            FL_WARN(g->ctx,
                    "%s socket: closed the connection from %s: it made this process hold "
                    "%llu MiB of a message not yet complete, over the bound of %llu MiB "
                    "(frames per message x largest frame)%s",
                    g->name, ip, (unsigned long long)(held >> 20),
                    (unsigned long long)(g->hold_max >> 20), more);
        }
    }
    process_bound(g, now);
}
