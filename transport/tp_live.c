/* Liveness table: when each peer was last heard from, and which are dead or gone. Pure
 * bookkeeping (the caller passes the time), so the timeout logic is tested without sockets. */
#include "fl_tp.h"

#include <stdlib.h>

struct fl_tp_live {
    int n;
    int timeout_ms;
    int64_t *last;
    uint8_t *state;
};

int fl_tp_live_create(int npeers, int timeout_ms, fl_tp_live_t **out)
{
    *out = NULL;
    if (npeers < 1 || timeout_ms < 1)
        return fl_fail(FL_EINVAL, "liveness: %d peers, timeout %d ms", npeers, timeout_ms);
    fl_tp_live_t *l = calloc(1, sizeof *l);
    if (l == NULL)
        return fl_fail(FL_ENOMEM, "liveness: out of memory");
    l->last = calloc((size_t)npeers, sizeof *l->last);
    l->state = calloc((size_t)npeers, sizeof *l->state);
    if (l->last == NULL || l->state == NULL) {
        fl_tp_live_destroy(&l);
        return fl_fail(FL_ENOMEM, "liveness: out of memory for %d peers", npeers);
    }
    l->n = npeers;
    l->timeout_ms = timeout_ms;
    *out = l;
    return FL_OK;
}

void fl_tp_live_destroy(fl_tp_live_t **live)
{
    if (live == NULL || *live == NULL)
        return;
    free((*live)->last);
    free((*live)->state);
    free(*live);
    *live = NULL;
}

void fl_tp_live_heard(fl_tp_live_t *l, int peer, int64_t now_ms)
{
    if (peer < 0 || peer >= l->n)
        return;
    if (l->state[peer] == FL_PEER_DEAD || l->state[peer] == FL_PEER_GONE)
        return;
    l->state[peer] = FL_PEER_ALIVE;
    l->last[peer] = now_ms;
}

void fl_tp_live_gone(fl_tp_live_t *l, int peer)
{
    if (peer >= 0 && peer < l->n && l->state[peer] != FL_PEER_DEAD)
        l->state[peer] = FL_PEER_GONE;
}

void fl_tp_live_forget(fl_tp_live_t *l, int peer)
{
    if (peer >= 0 && peer < l->n) {
        l->state[peer] = FL_PEER_UNKNOWN;
        l->last[peer] = 0;
    }
}

int fl_tp_live_check(fl_tp_live_t *l, int64_t now_ms, int64_t *silent_ms)
{
    for (int i = 0; i < l->n; i++) {
        if (l->state[i] != FL_PEER_ALIVE)
            continue;
        int64_t silent = now_ms - l->last[i];
        if (silent > l->timeout_ms) {
            l->state[i] = FL_PEER_DEAD;
            if (silent_ms != NULL)
                *silent_ms = silent;
            return i;
        }
    }
    return -1;
}

fl_tp_peer_state_t fl_tp_live_state(const fl_tp_live_t *l, int peer)
{
    if (peer < 0 || peer >= l->n)
        return FL_PEER_UNKNOWN;
    return (fl_tp_peer_state_t)l->state[peer];
}

int64_t fl_tp_live_last(const fl_tp_live_t *l, int peer)
{
    if (peer < 0 || peer >= l->n)
        return 0;
    return l->last[peer];
}
