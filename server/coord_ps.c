/* The parameter server's side of the coordinator: flodl-ps processes register the shards they
 * serve (with their endpoints, settings and, when resuming, the checkpoint steps they hold);
 * the job starts once every shard is served and the parameter count is known; the welcome
 * then carries the shard map, the settings and the step every shard resumes from (the newest
 * step all of them hold). A server that dies or leaves while the job runs ends the job: every
 * member is told the parameter server must restart, so ranks register again with its
 * successor instead of failing. */
#include "coord_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Code of the shutdown that tells members the parameter server is restarting. */
#define SHUTDOWN_PS_RESTART 2

/* Formats into a fixed text field, cutting what does not fit (texts are for people). */
static void text_of(char *dst, size_t cap, const char *fmt, ...) FL_PRINTF(3, 4);

static void text_of(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

static int last_shard(const coord_server_t *v)
{
    return v->reg.rank + (int)v->reg.shard_count - 1;
}

static const char *server_name(const coord_server_t *v, char *buf, size_t cap)
{
    if (v->reg.shard_count == 1)
        snprintf(buf, cap, "the server of shard %d (host %s, pid %d)", v->reg.rank, v->reg.host,
                 v->reg.pid);
    else
        snprintf(buf, cap, "the server of shards %d..%d (host %s, pid %d)", v->reg.rank,
                 last_shard(v), v->reg.host, v->reg.pid);
    return buf;
}

/* What a refusal may say of a server: its shards, never its host or pid. */
static const char *server_label(const coord_server_t *v, char *buf, size_t cap)
{
    snprintf(buf, cap, "the server of shards %d..%d", v->reg.rank, last_shard(v));
    return buf;
}

int fl_coord_ps_slot_of_route(const fl_coord_t *c, const fl_tp_route_t *route)
{
    for (int i = 0; i < c->nshards; i++)
        if (c->servers[i].registered && fl_coord_same_route(&c->servers[i].route, route))
            return i;
    return -1;
}

bool fl_coord_ps_complete(const fl_coord_t *c)
{
    return c->nshards == 0 || c->shards_covered == c->nshards;
}

/* The parameter count some member (or the options) declared, and who (without host or pid:
 * it goes into refusals): 0 when none did. */
static uint64_t known_params(const fl_coord_t *c, char *who, size_t cap)
{
    if (c->init_params != 0) {
        snprintf(who, cap, "the coordinator's --init file");
        return c->init_params;
    }
    for (int i = 0; i < c->nshards; i++) {
        const coord_server_t *v = &c->servers[i];
        if (v->registered && v->reg.param_count != 0) {
            server_label(v, who, cap);
            return v->reg.param_count;
        }
    }
    for (int r = 0; r < c->world; r++) {
        const coord_rank_t *k = &c->ranks[r];
        if (k->registered && k->reg.param_count != 0) {
            snprintf(who, cap, "rank %d", r);
            return k->reg.param_count;
        }
    }
    return 0;
}

int fl_coord_ps_check_params(const fl_coord_t *c, uint64_t count, const char *who, char *why,
                             size_t cap)
{
    char other[FL_HOST_MAX + 96];
    uint64_t known = known_params(c, other, sizeof other);
    if (known == 0 || known == count)
        return FL_OK;
    snprintf(why, cap,
             "%s has %" PRIu64 " parameters, %s has %" PRIu64 ": they hold different "
             "models",
             who, count, other, known);
    return FL_EINVAL;
}

/* Where a member's model lives, as the texts name it, and its tensors' lines: a server's
 * text may start with the line naming its --init file. */
static const char *model_owner(const fl_msg_register_t *r, char *out, size_t cap)
{
    const char *text = r->model_shapes;
    size_t tag = strlen(FL_PS_INIT_FILE_TAG);
    const char *nl = strchr(text, ';');
    if (r->role != FL_ROLE_SERVER) {
        snprintf(out, cap, "on rank %d (host %s)", r->rank, r->host);
        return text;
    }
    if (strncmp(text, FL_PS_INIT_FILE_TAG, tag) == 0 && nl != NULL) {
        snprintf(out, cap,
                 "in %.*s (the --init file of the parameter server on %s, shards "
                 "%d..%d)",
                 (int)(nl - text - (ptrdiff_t)tag), text + tag, r->host, r->rank,
                 r->rank + (int)r->shard_count - 1);
        return nl + 1;
    }
    snprintf(out, cap, "in the --init file of the parameter server on %s (shards %d..%d)", r->host,
             r->rank, r->rank + (int)r->shard_count - 1);
    return text;
}

/* True when both members described their tensors and the signatures differ; why then names
 * the first tensor that differs. */
static bool models_differ(const fl_msg_register_t *a, const fl_msg_register_t *b, char *why,
                          size_t cap)
{
    if (a->model_shapes[0] == '\0' || b->model_shapes[0] == '\0' ||
        a->model_signature == b->model_signature)
        return false;
    char who_a[FL_MODEL_SHAPES_MAX], who_b[FL_MODEL_SHAPES_MAX];
    const char *text_a = model_owner(a, who_a, sizeof who_a);
    const char *text_b = model_owner(b, who_b, sizeof who_b);
    int n = snprintf(why, cap, "different models: ");
    if (n > 0 && (size_t)n < cap)
        fl_model_shapes_diff(text_a, who_a, text_b, who_b, why + n, cap - (size_t)n);
    return true;
}

int fl_coord_check_model(const fl_coord_t *c, const fl_msg_register_t *reg,
                         const fl_msg_register_t **other, char *why, size_t cap)
{
    *other = NULL;
    for (int i = 0; i < c->nshards; i++) {
        const coord_server_t *v = &c->servers[i];
        if (v->registered && !v->left && models_differ(reg, &v->reg, why, cap)) {
            *other = &v->reg;
            return FL_EINVAL;
        }
    }
    for (int r = 0; r < c->world; r++) {
        const coord_rank_t *k = &c->ranks[r];
        if (k->registered && !k->left && models_differ(reg, &k->reg, why, cap)) {
            *other = &k->reg;
            return FL_EINVAL;
        }
    }
    return FL_OK;
}

/* Settings every server must share; a text naming the difference, or NULL when they agree. */
static bool same_settings(const fl_msg_register_t *a, const fl_msg_register_t *b)
{
    return a->consistency == b->consistency && a->staleness == b->staleness &&
           a->ckpt_every_steps == b->ckpt_every_steps && a->ckpt_every_ms == b->ckpt_every_ms &&
           strcmp(a->tuning, b->tuning) == 0;
}

static void describe_settings(const fl_msg_register_t *r, char *out, size_t cap)
{
    static const char *const names[] = {"sync", "async", "ssp"};
    snprintf(out, cap,
             "consistency=%s,staleness=%u,checkpoint-every=%" PRIu64 "steps/%" PRIu64 "ms,%s",
             r->consistency < 3 ? names[r->consistency] : "?", r->staleness, r->ckpt_every_steps,
             r->ckpt_every_ms, r->tuning);
}

/* The checks a server's registration must pass whatever the job's state: its job and the
 * shards it serves. False when it was refused. */
static bool server_fits_job(fl_coord_t *c, const fl_tp_msg_t *m)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    const fl_tp_route_t *to = &m->route;
    int first = reg->rank;
    int count = (int)reg->shard_count;
    const char *host = reg->host;
    if (strcmp(m->hdr.job_id, c->job_id) != 0) {
        char shown[FL_HOST_MAX];
        char job[FL_JOB_MAX];
        fl_ctx_count(c->ctx, FL_STAT_BAD_JOB, 1);
        fl_coord_warn(c,
                      "refused the parameter server on %s (pid %d) of job '%s': this is job "
                      "'%s'",
                      fl_text_escape(host, shown, sizeof shown), reg->pid,
                      fl_text_escape(m->hdr.job_id, job, sizeof job), c->job_id);
        fl_coord_send_refusal(c, to, FL_EINVAL, -1, host,
                              "parameter server on %s belongs to job '%s', this "
                              "coordinator runs job '%s'",
                              host, m->hdr.job_id, c->job_id);
        return false;
    }
    if (c->nshards == 0)
        fl_coord_refuse(c, to, -1, host,
                        "parameter server on %s refused: job '%s' has no parameter "
                        "server (the coordinator runs with 0 shards)",
                        host, c->job_id);
    else if ((int)reg->num_shards != c->nshards)
        fl_coord_refuse(c, to, -1, host,
                        "parameter server on %s serves a job of %u shards, the "
                        "coordinator expects %d",
                        host, reg->num_shards, c->nshards);
    else if (count < 1 || first < 0 || first >= c->nshards || count > c->nshards - first)
        fl_coord_refuse(c, to, -1, host,
                        "parameter server on %s registered shards %d..%d, outside "
                        "0..%d",
                        host, first, first + count - 1, c->nshards - 1);
    else if ((int)reg->nshard_eps != count)
        fl_coord_refuse(c, to, -1, host,
                        "parameter server on %s registered %d shards with %u "
                        "endpoints",
                        host, count, reg->nshard_eps);
    else
        return true;
    return false;
}

/* A registration for shards a server holds already: a retry from its connection, the same
 * process on a new connection (proven by the token of its welcome, never by host and pid), or
 * anyone else, refused without a word about the holder. False when no server holds any of
 * them. */
static bool server_again(fl_coord_t *c, const fl_tp_msg_t *m)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    const fl_tp_route_t *to = &m->route;
    int first = reg->rank;
    int count = (int)reg->shard_count;
    if (fl_coord_ps_slot_of_route(c, to) >= 0) {
        if (c->phase == PHASE_RUNNING)
            fl_coord_welcome_again(c, to); /* a retry after a lost welcome */
        return true;
    }
    for (int i = 0; i < c->nshards; i++) {
        coord_server_t *v = &c->servers[i];
        if (!v->registered || first > last_shard(v) || first + count - 1 < v->reg.rank)
            continue;
        if (i == first && !v->left && (int)v->reg.shard_count == count &&
            strcmp(v->key, m->peer_key) == 0 && fl_coord_token_ok(v->token, reg->token) &&
            fl_tp_live_state(c->live, c->world + i) != FL_PEER_DEAD) {
            /* The same process on a new connection. */
            v->route = *to;
            fl_tp_live_heard(c->live, c->world + i, fl_now_ms());
            if (c->phase == PHASE_RUNNING)
                fl_coord_welcome_again(c, to);
            return true;
        }
        char name[FL_HOST_MAX + 96];
        char shown[FL_HOST_MAX];
        fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
        fl_coord_warn(c,
                      "refused a registration for shards %d..%d from host %s (pid %d): %s; %s "
                      "serves some of them",
                      first, first + count - 1, fl_text_escape(reg->host, shown, sizeof shown),
                      reg->pid,
                      reg->token[0] ? "its token is not the server's" : "it gave no token",
                      server_name(v, name, sizeof name));
        fl_coord_send_refusal(c, to, FL_EINVAL, -1, reg->host,
                              "parameter server on %s registered shards %d..%d, which another "
                              "parameter server serves; a registration for them from a new "
                              "connection must give the token of its welcome",
                              reg->host, first, first + count - 1);
        return true;
    }
    return false;
}

/* A new server during the rendezvous must agree with the servers registered (settings) and
 * with every member (model, parameter count). False when it was refused. */
static bool server_agrees(fl_coord_t *c, const fl_tp_msg_t *m)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    const fl_tp_route_t *to = &m->route;
    const char *host = reg->host;
    if (c->phase != PHASE_RENDEZVOUS) {
        fl_coord_refuse(c, to, -1, host,
                        "parameter server on %s registered after job '%s' %s; a "
                        "parameter server cannot join a running job: restart every "
                        "flodl-ps with --resume",
                        host, c->job_id, c->phase == PHASE_RUNNING ? "started" : "failed");
        return false;
    }
    for (int i = 0; i < c->nshards; i++) {
        coord_server_t *v = &c->servers[i];
        if (v->registered && !same_settings(&v->reg, reg)) {
            char mine[FL_MSG_TUNING_MAX + 96], theirs[FL_MSG_TUNING_MAX + 96];
            char name[FL_HOST_MAX + 96];
            describe_settings(reg, mine, sizeof mine);
            describe_settings(&v->reg, theirs, sizeof theirs);
            fl_coord_refuse(c, to, -1, host,
                            "parameter server on %s uses '%s', %s uses '%s'; all "
                            "servers must agree",
                            host, mine, server_label(v, name, sizeof name), theirs);
            return false;
        }
    }
    char who[FL_HOST_MAX + 96];
    char why[FL_MSG_TEXT_MAX];
    const fl_msg_register_t *other = NULL;
    if (fl_coord_check_model(c, reg, &other, why, sizeof why) != FL_OK) {
        fl_coord_send_refusal(c, to, FL_EINVAL, -1, host, "%s", why);
        /* Ranks hold another model than the --init file: the job cannot start until one side
         * is restarted, and everyone hears why now rather than at the rendezvous timeout.
         * Another server's --init only refuses this one, as other settings do. */
        if (other->role != FL_ROLE_SERVER)
            fl_coord_fail_rendezvous(c, why);
        return false;
    }
    snprintf(who, sizeof who, "the parameter server on %s (shards %d..%d)", host, reg->rank,
             reg->rank + (int)reg->shard_count - 1);
    if (reg->param_count != 0 &&
        fl_coord_ps_check_params(c, reg->param_count, who, why, sizeof why) != FL_OK) {
        fl_coord_refuse(c, to, -1, host, "%s", why);
        return false;
    }
    return true;
}

/* Takes a server in: its slot is its first shard, and its registration (with the shard
 * endpoints' table) moves into the coordinator's state. */
static void take_server(fl_coord_t *c, fl_tp_msg_t *m)
{
    fl_msg_register_t *reg = &m->hdr.u.reg;
    int first = reg->rank;
    int count = (int)reg->shard_count;
    coord_server_t *v = &c->servers[first];
    free(v->reg.shard_eps);
    v->registered = true;
    v->left = false;
    v->route = m->route;
    snprintf(v->key, sizeof v->key, "%s", m->peer_key);
    v->reg = *reg;
    v->reg.token[0] = '\0'; /* a token of another coordinator proves nothing here */
    fl_coord_token_new(c, v->token);
    reg->shard_eps = NULL; /* the table moves to the coordinator's state */
    reg->nshard_eps = 0;
    c->shards_covered += count;
    atomic_fetch_add(&c->nservers_active, 1);
    fl_tp_live_forget(c->live, c->world + first);
    fl_tp_live_heard(c->live, c->world + first, fl_now_ms());
    char shown[FL_HOST_MAX];
    FL_INFO(c->ctx,
            "parameter server for shards %d..%d registered from %s (pid %d): %d of %d "
            "shards served",
            first, first + count - 1, fl_text_escape(v->reg.host, shown, sizeof shown), v->reg.pid,
            c->shards_covered, c->nshards);
    fl_coord_maybe_start(c);
}

void fl_coord_ps_on_register(fl_coord_t *c, fl_tp_msg_t *m)
{
    if (server_fits_job(c, m) && !server_again(c, m) && server_agrees(c, m))
        take_server(c, m);
}

/* Forgets a server that left or died during the rendezvous, so a restarted one can take its
 * shards. */
static void forget(fl_coord_t *c, int slot)
{
    coord_server_t *v = &c->servers[slot];
    c->shards_covered -= (int)v->reg.shard_count;
    free(v->reg.shard_eps);
    memset(v, 0, sizeof *v);
    fl_tp_live_forget(c->live, c->world + slot);
}

/* A server is gone while the job runs: the job ends, and every member is told to wait for the
 * parameter server's restart. */
static void server_gone(fl_coord_t *c, int slot, const char *text)
{
    char shown[FL_MSG_TEXT_MAX];
    FL_ERROR(c->ctx, "%s", fl_text_escape(text, shown, sizeof shown));
    (void)slot;
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, -1);
    h.u.shutdown.code = SHUTDOWN_PS_RESTART;
    text_of(h.u.shutdown.text, sizeof h.u.shutdown.text,
            "%s; the parameter server must restart (every flodl-ps with --resume)", text);
    fl_coord_send_all(c, &h);
    c->phase = PHASE_FAILED;
    c->ps_lost = true;
    fl_coord_finish(c, FL_EPEER, text);
}

/* A server stopped on an error of its own (bad initial parameters, a disk it cannot write):
 * a restart would meet it again, so the job is over. Every member hears it as an error and
 * exits, instead of waiting for a restart that is not coming. */
static void server_failed(fl_coord_t *c, const char *text)
{
    FL_ERROR(c->ctx, "%s", text);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, -1);
    h.u.error.code = FL_EPEER;
    h.u.error.about_rank = -1;
    snprintf(h.u.error.text, sizeof h.u.error.text, "%s", text);
    fl_coord_send_all(c, &h);
    c->phase = PHASE_FAILED;
    fl_coord_finish(c, FL_EPEER, text);
}

void fl_coord_ps_on_message(fl_coord_t *c, fl_tp_msg_t *m, int slot)
{
    coord_server_t *v = &c->servers[slot];
    int live = c->world + slot;
    if (fl_tp_live_state(c->live, live) == FL_PEER_DEAD || v->left)
        return;
    fl_tp_live_heard(c->live, live, fl_now_ms());
    char name[FL_HOST_MAX + 96];
    char text[FL_MSG_TEXT_MAX];
    switch (m->hdr.type) {
    case FL_MSG_HEARTBEAT: return;
    case FL_MSG_SHUTDOWN:
        server_name(v, name, sizeof name);
        if (c->phase == PHASE_RENDEZVOUS) {
            FL_INFO(c->ctx, "%s left before the job started",
                    fl_text_escape(name, text, sizeof text));
            atomic_fetch_sub(&c->nservers_active, 1);
            forget(c, slot);
            return;
        }
        v->left = true;
        v->token[0] = '\0';
        atomic_fetch_sub(&c->nservers_active, 1);
        fl_tp_live_gone(c->live, live);
        if (c->phase == PHASE_RUNNING && c->nleft + c->ndead < c->world &&
            m->hdr.u.shutdown.code < 0) {
            text_of(text, sizeof text, "%s failed: %s", name, m->hdr.u.shutdown.text);
            server_failed(c, text);
            return;
        }
        if (c->phase == PHASE_RUNNING && c->nleft + c->ndead < c->world) {
            text_of(text, sizeof text, "%s left before the job ended: %s", name,
                    m->hdr.u.shutdown.text);
            server_gone(c, slot, text);
            return;
        }
        char said[FL_MSG_TEXT_MAX];
        FL_INFO(c->ctx, "%s left: %s", fl_text_escape(name, text, sizeof text),
                fl_text_escape(m->hdr.u.shutdown.text, said, sizeof said));
        return;
    default:
        fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
        fl_coord_send_error(c, &m->route, FL_EPROTO, -1, "",
                            "coordinator: unexpected %s message from %s",
                            fl_msg_type_name(m->hdr.type), server_name(v, name, sizeof name));
        return;
    }
}

void fl_coord_ps_dead(fl_coord_t *c, int slot, int64_t silent_ms)
{
    coord_server_t *v = &c->servers[slot];
    char name[FL_HOST_MAX + 96];
    server_name(v, name, sizeof name);
    atomic_fetch_sub(&c->nservers_active, 1);
    if (c->phase == PHASE_RENDEZVOUS) {
        FL_WARN(c->ctx,
                "%s silent for %lld ms during the rendezvous; dropping its "
                "registration",
                name, (long long)silent_ms);
        forget(c, slot);
        return;
    }
    if (c->phase != PHASE_RUNNING)
        return;
    v->token[0] = '\0';
    char text[FL_MSG_TEXT_MAX];
    snprintf(text, sizeof text, "%s declared dead: silent for %lld ms (timeout %d ms)", name,
             (long long)silent_ms, c->hb_timeout_ms);
    server_gone(c, slot, text);
}

void fl_coord_ps_send_all(fl_coord_t *c, fl_msg_hdr_t *h)
{
    for (int i = 0; i < c->nshards; i++) {
        coord_server_t *v = &c->servers[i];
        if (!v->registered || v->left || fl_tp_live_state(c->live, c->world + i) == FL_PEER_DEAD)
            continue;
        fl_tp_send(c->sock, &v->route, h, NULL, 0, fl_deadline_in(0));
    }
}

void fl_coord_ps_missing(const fl_coord_t *c, char *out, size_t cap)
{
    if (fl_coord_ps_complete(c))
        return;
    size_t n = strlen(out);
    int from = -1;
    bool any = false;
    for (int s = 0; s <= c->nshards; s++) {
        bool covered = true;
        if (s < c->nshards) {
            covered = false;
            for (int i = 0; i <= s && !covered; i++) {
                const coord_server_t *v = &c->servers[i];
                covered = v->registered && s >= v->reg.rank && s <= last_shard(v);
            }
        }
        if (!covered && from < 0)
            from = s;
        if (covered && from >= 0 && n + 32 < cap) {
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n > 0 && !any ? ", " : "",
                                  any ? "," : "shards ");
            if (s - 1 > from)
                n += (size_t)snprintf(out + n, cap - n, "%d..%d", from, s - 1);
            else
                n += (size_t)snprintf(out + n, cap - n, "%d", from);
            any = true;
            from = -1;
        }
    }
}

/* Chooses the step every shard resumes from: the newest one all servers hold. */
static int choose_resume(const fl_coord_t *c, fl_msg_welcome_t *w, char *why, size_t cap)
{
    int with = 0, without = -1, ref = -1;
    for (int i = 0; i < c->nshards; i++) {
        const coord_server_t *v = &c->servers[i];
        if (!v->registered)
            continue;
        if (v->reg.ncheckpoints > 0) {
            with++;
            if (ref < 0)
                ref = i;
        } else if (without < 0) {
            without = i;
        }
    }
    if (with == 0)
        return FL_OK;
    char a[FL_HOST_MAX + 96], b[FL_HOST_MAX + 96];
    if (without >= 0) {
        snprintf(why, cap,
                 "%s has no checkpoint to resume from while %s has checkpoints up to "
                 "step %" PRIu64 ": refusing to start shards from different steps",
                 server_name(&c->servers[without], a, sizeof a),
                 server_name(&c->servers[ref], b, sizeof b), c->servers[ref].reg.checkpoints[0]);
        return FL_EINVAL;
    }
    const fl_msg_register_t *r = &c->servers[ref].reg;
    for (uint32_t k = 0; k < r->ncheckpoints; k++) {
        uint64_t step = r->checkpoints[k];
        bool everywhere = true;
        for (int i = 0; i < c->nshards && everywhere; i++) {
            const coord_server_t *v = &c->servers[i];
            if (!v->registered)
                continue;
            bool has = false;
            for (uint32_t j = 0; j < v->reg.ncheckpoints && !has; j++)
                has = v->reg.checkpoints[j] == step;
            everywhere = has;
        }
        if (everywhere) {
            w->resume = true;
            w->resume_step = step;
            return FL_OK;
        }
    }
    size_t n = (size_t)snprintf(why, cap, "no checkpoint step is held by every shard:");
    for (int i = 0; i < c->nshards && n + 64 < cap; i++) {
        const coord_server_t *v = &c->servers[i];
        if (!v->registered)
            continue;
        n += (size_t)snprintf(why + n, cap - n, " shards %d..%d have", v->reg.rank, last_shard(v));
        for (uint32_t j = 0; j < v->reg.ncheckpoints && n + 24 < cap; j++)
            n += (size_t)snprintf(why + n, cap - n, " %" PRIu64, v->reg.checkpoints[j]);
        if (n + 2 < cap)
            n += (size_t)snprintf(why + n, cap - n, ";");
    }
    return FL_EINVAL;
}

int fl_coord_ps_fill_welcome(fl_coord_t *c, fl_msg_hdr_t *h, char *why, size_t cap)
{
    if (c->nshards == 0)
        return FL_OK;
    char who[FL_HOST_MAX + 96];
    uint64_t n = known_params(c, who, sizeof who);
    if (n == 0) {
        snprintf(why, cap,
                 "job '%s' cannot start: no rank declared its parameter count and "
                 "the parameter server has no --init file or checkpoint",
                 c->job_id);
        return FL_EINVAL;
    }
    /* Every shard must hold something: n fills at least as many blocks as there are shards. */
    if ((n + FL_PS_ALIGN - 1) / FL_PS_ALIGN < (uint64_t)c->nshards) {
        snprintf(why, cap,
                 "job '%s' cannot start: %" PRIu64 " parameters do not fill %d shards "
                 "of at least %d (use at most %" PRIu64 " shards)",
                 c->job_id, n, c->nshards, FL_PS_ALIGN, (n + FL_PS_ALIGN - 1) / FL_PS_ALIGN);
        return FL_EINVAL;
    }
    fl_msg_welcome_t *w = &h->u.welcome;
    if (fl_msg_welcome_alloc_shards(h, (uint32_t)c->nshards) != FL_OK) {
        snprintf(why, cap, "%s", fl_last_error());
        return FL_ENOMEM;
    }
    const fl_msg_register_t *settings = NULL;
    for (int i = 0; i < c->nshards; i++) {
        const coord_server_t *v = &c->servers[i];
        if (!v->registered)
            continue;
        settings = settings ? settings : &v->reg;
        for (uint32_t j = 0; j < v->reg.shard_count; j++) {
            uint32_t idx = (uint32_t)v->reg.rank + j;
            fl_msg_shard_t *s = &w->shards[idx];
            fl_ps_range_t range;
            fl_ps_map_range(n, (uint32_t)c->nshards, idx, &range);
            s->index = idx;
            s->offset = range.offset;
            s->count = range.count;
            memcpy(s->endpoint, v->reg.shard_eps[j], sizeof s->endpoint);
            memcpy(s->host, v->reg.host, sizeof s->host);
        }
    }
    w->param_count = n;
    if (settings != NULL) {
        w->consistency = settings->consistency;
        w->staleness = settings->staleness;
        w->ckpt_every_steps = settings->ckpt_every_steps;
        w->ckpt_every_ms = settings->ckpt_every_ms;
    }
    return choose_resume(c, w, why, cap);
}

void fl_coord_ps_free(fl_coord_t *c)
{
    if (c->servers == NULL)
        return;
    for (int i = 0; i < c->nshards; i++)
        free(c->servers[i].reg.shard_eps);
    free(c->servers);
    c->servers = NULL;
}
