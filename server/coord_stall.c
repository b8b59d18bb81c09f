/* The stall report: when a collective has made no progress for stall_ms (no rank's heartbeat
 * shows it moving), the coordinator logs every rank's state from its last heartbeat (the
 * collective and step it is in, or the last one it finished; whom it waits for; how long ago
 * it was heard from), so the rank that has not arrived stands out. Repeated every stall_ms
 * while the stall lasts. Coordinator thread only. */
#include "coord_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fl_coord_stall_check(fl_coord_t *c, int64_t now)
{
    if (c->stall_ms <= 0 || c->phase == PHASE_RENDEZVOUS || c->phase == PHASE_FAILED)
        return;
    if (c->last_stall_ms != 0 && now - c->last_stall_ms < c->stall_ms)
        return;
    /* The stuck collective: the one an alive rank has been in longest without progress. */
    int stuck = -1;
    int64_t longest = 0;
    for (int r = 0; r < c->world; r++) {
        const coord_rank_t *k = &c->ranks[r];
        if (!k->registered || k->left || k->op == 0 || k->progress_ms == 0 ||
            fl_tp_live_state(c->live, r) == FL_PEER_DEAD)
            continue;
        int64_t idle = now - k->progress_ms;
        if (idle >= c->stall_ms && idle > longest) {
            longest = idle;
            stuck = r;
        }
    }
    if (stuck < 0)
        return;
    c->last_stall_ms = now;
    size_t cap = (size_t)c->world * 400 + 512;
    char *text = malloc(cap);
    if (text == NULL)
        return;
    const coord_rank_t *s = &c->ranks[stuck];
    size_t len =
        (size_t)snprintf(text, cap,
                         "stall: rank %d (%s) has made no progress in collective #%llu "
                         "for %lld ms; every rank:",
                         stuck, s->reg.host, (unsigned long long)s->op_seq, (long long)longest);
    for (int r = 0; r < c->world && len < cap; r++) {
        const coord_rank_t *k = &c->ranks[r];
        char op[160];
        if (!k->registered) {
            len += (size_t)snprintf(text + len, cap - len, "\n  rank %d: not registered", r);
            continue;
        }
        if (k->left) {
            len +=
                (size_t)snprintf(text + len, cap - len, "\n  rank %d (%s): left", r, k->reg.host);
            continue;
        }
        fl_coord_describe_op(k, op, sizeof op);
        const char *behind = k->op_seq < s->op_seq ? " -- has not arrived" : "";
        len += (size_t)snprintf(text + len, cap - len,
                                "\n  rank %d (%s): %s%s; last heard %lld ms ago", r, k->reg.host,
                                op, behind, (long long)(now - fl_tp_live_last(c->live, r)));
    }
    FL_WARN(c->ctx, "%s", text);
    free(text);
}
