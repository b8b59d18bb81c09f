/* The coordinator's periodic work: heartbeats to every member (with the missing ones during
 * the rendezvous), members silent past the timeout declared dead, the rendezvous deadline,
 * and the view of the job that fl_coord_get_info hands out. Messages are coord_handle.c's. */
#include "coord_int.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void missing_list(const fl_coord_t *c, char *out, size_t cap)
{
    size_t n = 0;
    int shown = 0;
    int missing = 0;
    out[0] = '\0';
    for (int r = 0; r < c->world; r++) {
        if (c->ranks[r].registered)
            continue;
        missing++;
        if (shown < 32 && n + 16 < cap) {
            n += (size_t)snprintf(out + n, cap - n, "%s%d", shown ? "," : "", r);
            shown++;
        }
    }
    if (missing > shown && n + 24 < cap)
        snprintf(out + n, cap - n, " and %d more", missing - shown);
    fl_coord_ps_missing(c, out, cap);
}

void fl_coord_describe_op(const coord_rank_t *k, char *out, size_t cap)
{
    /* A parameter-server client: no data endpoint, a parameter count. */
    bool ps = fl_msg_op_is_ps(k->op) || (k->reg.nendpoints == 0 && k->reg.param_count > 0);
    if (ps && k->op == 0)
        snprintf(out, cap, "between steps (its last push or pull was for step %llu)",
                 (unsigned long long)k->op_seq);
    else if (ps)
        snprintf(out, cap, "in the %s of step %llu", fl_msg_op_name(k->op),
                 (unsigned long long)k->op_seq);
    else if (k->op == 0)
        snprintf(out, cap, "not in a collective (the last was #%llu)",
                 (unsigned long long)k->op_seq);
    else if (k->waiting_on >= 0)
        snprintf(out, cap, "in %s #%llu (step %u), waiting for rank %d", fl_msg_op_name(k->op),
                 (unsigned long long)k->op_seq, k->op_step, k->waiting_on);
    else
        snprintf(out, cap, "in %s #%llu (step %u)", fl_msg_op_name(k->op),
                 (unsigned long long)k->op_seq, k->op_step);
}

/* What the others say of a dead rank: the newest collective a rank waits for it in. Its own
 * last heartbeat may be a period older. */
static void others_view(const fl_coord_t *c, int dead, char *out, size_t cap)
{
    out[0] = '\0';
    int who = -1;
    for (int q = 0; q < c->world; q++) {
        const coord_rank_t *o = &c->ranks[q];
        if (q == dead || !o->registered || o->left || o->op == 0 || o->waiting_on != dead)
            continue;
        if (who < 0 || o->op_seq > c->ranks[who].op_seq)
            who = q;
    }
    if (who >= 0 && c->ranks[who].op_seq > c->ranks[dead].op_seq)
        snprintf(out, cap, "; rank %d waits for it in %s #%llu", who,
                 fl_msg_op_name(c->ranks[who].op), (unsigned long long)c->ranks[who].op_seq);
}

static void declare_dead(fl_coord_t *c, int dead, int64_t silent)
{
    coord_rank_t *k = &c->ranks[dead];
    char op[160];
    char view[128];
    char text[FL_MSG_TEXT_MAX];
    fl_coord_describe_op(k, op, sizeof op);
    others_view(c, dead, view, sizeof view);
    snprintf(text, sizeof text,
             "rank %d (host %.64s, pid %d) declared dead: silent for %lld ms "
             "(timeout %d ms); it was %s%s",
             dead, k->reg.host, k->reg.pid, (long long)silent, c->hb_timeout_ms, op, view);
    char shown[FL_MSG_TEXT_MAX];
    FL_ERROR(c->ctx, "%s", fl_text_escape(text, shown, sizeof shown));
    /* The rank itself hears it too, should it be frozen rather than gone (SIGSTOP, a paused
     * VM): on waking it finds this queued and exits instead of registering again. */
    char at[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fl_coord_send_error(c, &k->route, FL_EPEER, dead, k->reg.host,
                        "rank %d declared dead by the coordinator at %s: silent for %lld ms "
                        "(timeout %d ms); the job failed without it",
                        dead, at, (long long)silent, c->hb_timeout_ms);
    c->ndead++;
    k->token[0] = '\0'; /* dead: its identity is nobody's, its own process's neither */
    atomic_fetch_sub(&c->nactive, 1);
    k->failed = c->phase == PHASE_RUNNING; /* the first to end the job */
    if (c->phase == PHASE_RUNNING)
        fl_coord_fail_job(c, dead, text);
    else
        fl_coord_finish(c, FL_EPEER, text);
}

static void send_heartbeats(fl_coord_t *c)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, -1);
    if (c->phase == PHASE_RENDEZVOUS) {
        h.u.heartbeat.registered = (uint32_t)atomic_load(&c->nregistered);
        missing_list(c, h.u.heartbeat.missing, sizeof h.u.heartbeat.missing);
    }
    fl_coord_send_all(c, &h);
}

void fl_coord_publish(fl_coord_t *c, int64_t now)
{
    fl_coord_info_t in;
    memset(&in, 0, sizeof in);
    in.world = c->world;
    in.started = c->ran;
    in.generation = c->generation;
    in.bad_msgs = fl_ctx_stat(c->ctx, FL_STAT_BAD_HEADER) + fl_ctx_stat(c->ctx, FL_STAT_BAD_MAGIC) +
                  fl_ctx_stat(c->ctx, FL_STAT_BAD_VERSION) + fl_ctx_stat(c->ctx, FL_STAT_BAD_JOB) +
                  fl_ctx_stat(c->ctx, FL_STAT_BAD_FRAMES) + fl_ctx_stat(c->ctx, FL_STAT_OVERSIZED) +
                  fl_ctx_stat(c->ctx, FL_STAT_UNEXPECTED);
    in.auth_refused = fl_ctx_stat(c->ctx, FL_STAT_AUTH_REFUSED);
    pthread_mutex_lock(&c->lock);
    for (int r = 0; r < c->world; r++) {
        const coord_rank_t *k = &c->ranks[r];
        fl_coord_rank_info_t *ri = &c->rank_info[r];
        memset(ri, 0, sizeof *ri);
        if (!k->registered) {
            ri->state = FL_COORD_RANK_ABSENT;
            continue;
        }
        in.registered++;
        snprintf(ri->host, sizeof ri->host, "%s", k->reg.host);
        ri->op = k->op;
        ri->op_seq = k->op_seq;
        if (k->left) {
            ri->state = FL_COORD_RANK_LEFT;
            in.left++;
        } else if (fl_tp_live_state(c->live, r) == FL_PEER_DEAD) {
            ri->state = FL_COORD_RANK_DEAD;
            in.dead++;
        } else {
            ri->state = FL_COORD_RANK_ALIVE;
            in.alive++;
            int64_t last = fl_tp_live_last(c->live, r);
            ri->silent_s = last > 0 ? (double)(now - last) / 1e3 : 0.0;
        }
    }
    c->info = in;
    pthread_mutex_unlock(&c->lock);
}

void fl_coord_get_info(fl_coord_t *c, fl_coord_info_t *info, fl_coord_rank_info_t *ranks, int cap)
{
    pthread_mutex_lock(&c->lock);
    *info = c->info;
    for (int r = 0; ranks != NULL && r < cap && r < c->world; r++)
        ranks[r] = c->rank_info[r];
    pthread_mutex_unlock(&c->lock);
}

void fl_coord_tick(fl_coord_t *c, int64_t now)
{
    fl_coord_warn_flush(c, now);
    if (now - c->last_hb_ms >= c->hb_ms) {
        send_heartbeats(c);
        c->last_hb_ms = now;
    }
    int64_t silent;
    int dead;
    while ((dead = fl_tp_live_check(c->live, now, &silent)) >= 0) {
        if (dead >= c->world) {
            fl_coord_ps_dead(c, dead - c->world, silent);
            continue;
        }
        coord_rank_t *k = &c->ranks[dead];
        if (c->phase == PHASE_RENDEZVOUS) {
            /* Not started yet: forget it, so a restarted process can take the slot. */
            char host[FL_HOST_MAX];
            FL_WARN(c->ctx,
                    "rank %d (%s, pid %d) silent for %lld ms during the rendezvous; "
                    "dropping its registration",
                    dead, fl_text_escape(k->reg.host, host, sizeof host), k->reg.pid,
                    (long long)silent);
            k->registered = false;
            atomic_fetch_sub(&c->nregistered, 1);
            atomic_fetch_sub(&c->nactive, 1);
            fl_tp_live_forget(c->live, dead);
            continue;
        }
        declare_dead(c, dead, silent);
    }
    if (c->phase == PHASE_RENDEZVOUS && now - c->started_ms > c->rdv_timeout_ms) {
        char missing[FL_MSG_MISSING_MAX];
        char text[FL_MSG_TEXT_MAX];
        missing_list(c, missing, sizeof missing);
        snprintf(text, sizeof text,
                 "rendezvous of job '%s' timed out after %d ms: %d of %d "
                 "ranks registered, missing %s",
                 c->job_id, c->rdv_timeout_ms, atomic_load(&c->nregistered), c->world, missing);
        FL_ERROR(c->ctx, "%s", text);
        fl_coord_fail_rendezvous_all(c, FL_EPEER, FL_ETIMEDOUT, -1, "", text, NULL);
    }
}
