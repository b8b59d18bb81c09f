/* The coordinator's protocol: registrations (checked against the job and against each other;
 * every refusal names both sides), the welcome once all ranks are in, heartbeats from ranks,
 * ranks leaving, and a failed job told to the survivors. Bad messages get an error reply where
 * the sender can be reached; nothing here stops serving the others. The periodic work
 * (heartbeats out, deaths, deadlines) is coord_tick.c's. */
#include "coord_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

bool fl_coord_same_route(const fl_tp_route_t *a, const fl_tp_route_t *b)
{
    return a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

/* An error to one route: with the job's generation for members, without it (0) for a peer
 * not proven to be one. */
static void send_error_v(fl_coord_t *c, const fl_tp_route_t *to, bool member, int code, int about,
                         const char *host, const char *fmt, va_list ap)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, -1);
    h.u.error.code = code;
    h.u.error.about_rank = about;
    snprintf(h.u.error.host, sizeof h.u.error.host, "%s", host ? host : "");
    vsnprintf(h.u.error.text, sizeof h.u.error.text, fmt, ap);
    if (!member) /* the socket stamps what it holds: hold 0 for this one message */
        fl_tp_sock_set_stamp(c->sock, c->job_id, 0, -1);
    int rc = fl_tp_send(c->sock, to, &h, NULL, 0, fl_deadline_in(0));
    if (!member)
        fl_tp_sock_set_stamp(c->sock, c->job_id, c->generation, -1);
    if (rc == FL_OK)
        fl_ctx_count(c->ctx, FL_STAT_ERRORS_SENT, 1);
    else
        FL_DEBUG(c->ctx, "could not send error '%s': %s", h.u.error.text, fl_last_error());
}

void fl_coord_send_error(fl_coord_t *c, const fl_tp_route_t *to, int code, int about,
                         const char *host, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_error_v(c, to, true, code, about, host, fmt, ap);
    va_end(ap);
}

void fl_coord_send_refusal(fl_coord_t *c, const fl_tp_route_t *to, int code, int about,
                           const char *host, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_error_v(c, to, false, code, about, host, fmt, ap);
    va_end(ap);
}

void fl_coord_send_all(fl_coord_t *c, fl_msg_hdr_t *h)
{
    for (int r = 0; r < c->world; r++) {
        coord_rank_t *k = &c->ranks[r];
        if (k->registered && !k->left && fl_tp_live_state(c->live, r) != FL_PEER_DEAD)
            fl_tp_send(c->sock, &k->route, h, NULL, 0, fl_deadline_in(0));
    }
    fl_coord_ps_send_all(c, h);
}

/* A summary of the warnings held back: how many, and the bad-message counts by kind. */
static void warn_summary(fl_coord_t *c, uint64_t held)
{
    FL_WARN(c->ctx,
            "%llu more warnings held back in the last %d s; bad messages so far: "
            "header %llu, magic %llu, version %llu, job %llu, frames %llu, size %llu, "
            "unexpected %llu",
            (unsigned long long)held, c->warn_rl.window_ms / 1000,
            (unsigned long long)fl_ctx_stat(c->ctx, FL_STAT_BAD_HEADER),
            (unsigned long long)fl_ctx_stat(c->ctx, FL_STAT_BAD_MAGIC),
            (unsigned long long)fl_ctx_stat(c->ctx, FL_STAT_BAD_VERSION),
            (unsigned long long)fl_ctx_stat(c->ctx, FL_STAT_BAD_JOB),
            (unsigned long long)fl_ctx_stat(c->ctx, FL_STAT_BAD_FRAMES),
            (unsigned long long)fl_ctx_stat(c->ctx, FL_STAT_OVERSIZED),
            (unsigned long long)fl_ctx_stat(c->ctx, FL_STAT_UNEXPECTED));
}

void fl_coord_warn(fl_coord_t *c, const char *fmt, ...)
{
    uint64_t held = 0;
    bool allow = fl_ratelimit_allow(&c->warn_rl, fl_now_ms(), &held);
    if (held > 0)
        warn_summary(c, held);
    if (!allow)
        return;
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    FL_WARN(c->ctx, "%s", text);
}

void fl_coord_warn_flush(fl_coord_t *c, int64_t now)
{
    uint64_t held = fl_ratelimit_flush(&c->warn_rl, now);
    if (held > 0)
        warn_summary(c, held);
}

/* Who is already known by this route: the rank number or -1. */
static int rank_of_route(const fl_coord_t *c, const fl_tp_route_t *route)
{
    for (int r = 0; r < c->world; r++) {
        if (c->ranks[r].registered && fl_coord_same_route(&c->ranks[r].route, route))
            return r;
    }
    return -1;
}

void fl_coord_on_refused(fl_coord_t *c, fl_tp_msg_t *m)
{
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", fl_last_error());
    fl_coord_warn(c, "refused a message: %s", detail);
    if (m->route.len == 0)
        return;
    if (rank_of_route(c, &m->route) >= 0 || fl_coord_ps_slot_of_route(c, &m->route) >= 0)
        fl_coord_send_error(c, &m->route, FL_EPROTO, m->hdr.sender, "",
                            "coordinator %s (protocol version %u) refused your message: %s",
                            c->endpoint, FL_MSG_VERSION, detail);
    else
        fl_coord_send_refusal(c, &m->route, FL_EPROTO, m->hdr.sender, "",
                              "coordinator %s (protocol version %u) refused your message: %s",
                              c->endpoint, FL_MSG_VERSION, detail);
}

/* The end of a failed job, once the ranks were told: the servers hear it too (an error with
 * `code` about rank `about`), and the job finishes with rc. */
static void job_failed(fl_coord_t *c, int rc, int code, int about, const char *host,
                       const char *text)
{
    fl_msg_hdr_t e;
    fl_msg_hdr_init(&e, FL_MSG_ERROR, -1);
    e.u.error.code = code;
    e.u.error.about_rank = about;
    snprintf(e.u.error.host, sizeof e.u.error.host, "%s", host ? host : "");
    snprintf(e.u.error.text, sizeof e.u.error.text, "%s", text);
    fl_coord_ps_send_all(c, &e);
    c->phase = PHASE_FAILED;
    fl_coord_finish(c, rc, text);
}

/* The ranks told are gone for the coordinator: they leave without a goodbye, and flodl-ps
 * need not wait out their silence before it exits. */
void fl_coord_fail_rendezvous_all(fl_coord_t *c, int rc, int code, int about, const char *host,
                                  const char *text, const fl_tp_route_t *also)
{
    if (also != NULL)
        fl_coord_send_refusal(c, also, code, about, host, "%s", text);
    for (int q = 0; q < c->world; q++) {
        coord_rank_t *k = &c->ranks[q];
        if (!k->registered || k->left)
            continue;
        if (also == NULL || !fl_coord_same_route(&k->route, also))
            fl_coord_send_error(c, &k->route, code, about, host, "%s", text);
        k->left = true;
        k->token[0] = '\0';
        atomic_fetch_sub(&c->nactive, 1);
        fl_tp_live_gone(c->live, q);
    }
    job_failed(c, rc, code, about, host, text);
}

/* The welcome: the peer table and, with a parameter server, its shard map. Sent to one route
 * (a member that asks again) or, when the job starts, to every member. */
static void send_welcome(fl_coord_t *c, const fl_tp_route_t *to)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_WELCOME, -1);
    if (fl_msg_welcome_alloc(&h, (uint32_t)c->world) != FL_OK) {
        FL_ERROR(c->ctx, "%s", fl_last_error());
        return;
    }
    for (int r = 0; r < c->world; r++) {
        fl_msg_peer_t *p = &h.u.welcome.peers[r];
        const fl_msg_register_t *reg = &c->ranks[r].reg;
        p->rank = r;
        p->pid = reg->pid;
        memcpy(p->host, reg->host, sizeof p->host);
        p->nendpoints = reg->nendpoints;
        memcpy(p->endpoints, reg->endpoints, sizeof p->endpoints);
    }
    h.u.welcome.heartbeat_ms = (uint32_t)c->hb_ms;
    h.u.welcome.heartbeat_timeout_ms = (uint32_t)c->hb_timeout_ms;
    char why[FL_MSG_TEXT_MAX];
    if (fl_coord_ps_fill_welcome(c, &h, why, sizeof why) != FL_OK) {
        /* The job cannot start as registered: say so to everyone and fail. */
        fl_msg_hdr_deinit(&h);
        fl_coord_fail_rendezvous(c, why);
        return;
    }
    /* Each member's welcome carries its own token, over its own connection (encrypted with
     * CURVE): what proves it is that member if it must register again. */
    for (int r = 0; r < c->world; r++) {
        if (to != NULL && !fl_coord_same_route(to, &c->ranks[r].route))
            continue;
        char host[FL_HOST_MAX];
        snprintf(h.u.welcome.token, sizeof h.u.welcome.token, "%s", c->ranks[r].token);
        if (fl_tp_send(c->sock, &c->ranks[r].route, &h, NULL, 0, fl_deadline_in(1000)) != FL_OK)
            FL_ERROR(c->ctx, "welcome to rank %d (%s): %s", r,
                     fl_text_escape(c->ranks[r].reg.host, host, sizeof host), fl_last_error());
    }
    for (int i = 0; i < c->nshards; i++) {
        coord_server_t *v = &c->servers[i];
        if (!v->registered || (to != NULL && !fl_coord_same_route(to, &v->route)))
            continue;
        char host[FL_HOST_MAX];
        snprintf(h.u.welcome.token, sizeof h.u.welcome.token, "%s", v->token);
        if (fl_tp_send(c->sock, &v->route, &h, NULL, 0, fl_deadline_in(1000)) != FL_OK)
            FL_ERROR(c->ctx, "welcome to the server of shards %d.. (%s): %s", i,
                     fl_text_escape(v->reg.host, host, sizeof host), fl_last_error());
    }
    fl_msg_hdr_deinit(&h);
    if (to != NULL)
        return;
    c->phase = PHASE_RUNNING;
    c->ran = true;
    if (c->nshards > 0)
        FL_INFO(c->ctx, "all %d ranks and %d shards registered after %lld ms; job '%s' running",
                c->world, c->nshards, (long long)(fl_now_ms() - c->started_ms), c->job_id);
    else
        FL_INFO(c->ctx, "all %d ranks registered after %lld ms; job '%s' running", c->world,
                (long long)(fl_now_ms() - c->started_ms), c->job_id);
}

void fl_coord_fail_rendezvous(fl_coord_t *c, const char *why)
{
    FL_ERROR(c->ctx, "%s", why);
    fl_coord_fail_rendezvous_all(c, FL_EINVAL, FL_EINVAL, -1, "", why, NULL);
}

void fl_coord_maybe_start(fl_coord_t *c)
{
    if (c->phase == PHASE_RENDEZVOUS && atomic_load(&c->nregistered) == c->world &&
        fl_coord_ps_complete(c))
        send_welcome(c, NULL);
}

void fl_coord_welcome_again(fl_coord_t *c, const fl_tp_route_t *to)
{
    send_welcome(c, to);
}

/* The ranks disagree on what they must share: the newcomer (route `to`, rank r) and every
 * registered rank hear why, and the job ends before it started. */
static void fail_rendezvous(fl_coord_t *c, const fl_tp_route_t *to, int r, const char *host,
                            const char *why)
{
    char text[FL_MSG_TEXT_MAX];
    snprintf(text, sizeof text, "job '%.64s' cannot start: %.400s", c->job_id, why);
    FL_ERROR(c->ctx, "refused a registration: %s", text);
    c->ranks[r].refused = true;
    snprintf(c->ranks[r].leave_text, sizeof c->ranks[r].leave_text, "%s", why);
    fl_coord_fail_rendezvous_all(c, FL_EINVAL, FL_EINVAL, r, host, text, to);
}

void fl_coord_refuse(fl_coord_t *c, const fl_tp_route_t *to, int about, const char *host,
                     const char *fmt, ...)
{
    char text[FL_MSG_TEXT_MAX];
    char shown[FL_MSG_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fl_coord_warn(c, "refused a registration: %s", fl_text_escape(text, shown, sizeof shown));
    fl_coord_send_refusal(c, to, FL_EINVAL, about, host, "%s", text);
}

/* The checks a registration must pass whatever the job's state: its job, world size, rank
 * and endpoints. False when it was refused (the asker told why). host: reg->host escaped for
 * the log. */
static bool reg_fits_job(fl_coord_t *c, const fl_tp_msg_t *m, const char *host)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    const fl_tp_route_t *to = &m->route;
    int r = reg->rank;
    if (strcmp(m->hdr.job_id, c->job_id) != 0) {
        /* Another job's rank dialled this coordinator: counted with every other foreign
         * message (bad_job), and worth a line, since that job is now waiting for nothing. */
        char job[FL_JOB_MAX];
        fl_ctx_count(c->ctx, FL_STAT_BAD_JOB, 1);
        fl_coord_warn(c,
                      "refused a registration for rank %d from host %s (pid %d) of job '%s': "
                      "this is job '%s'",
                      r, host, reg->pid, fl_text_escape(m->hdr.job_id, job, sizeof job), c->job_id);
        fl_coord_send_refusal(c, to, FL_EINVAL, r, reg->host,
                              "rank %d (host %s) belongs to job '%s', this coordinator "
                              "runs job '%s'",
                              r, reg->host, m->hdr.job_id, c->job_id);
        return false;
    }
    if (reg->world_size != c->world)
        fl_coord_refuse(c, to, r, reg->host,
                        "rank %d (host %s) expects world size %d, the coordinator "
                        "expects %d",
                        r, reg->host, reg->world_size, c->world);
    else if (r < 0 || r >= c->world)
        fl_coord_refuse(c, to, r, reg->host,
                        "rank %d (host %s) is out of range 0..%d for world size %d", r, reg->host,
                        c->world - 1, c->world);
    else if (reg->nendpoints < 1 && reg->param_count == 0)
        fl_coord_refuse(c, to, r, reg->host,
                        "rank %d (host %s) registered without a data endpoint (only "
                        "parameter-server clients, which declare their parameter "
                        "count, need none)",
                        r, reg->host);
    else if (reg->nshard_eps > 0)
        fl_coord_refuse(c, to, r, reg->host,
                        "rank %d (host %s) registered shard endpoints, which only "
                        "parameter-server processes have",
                        r, reg->host);
    else
        return true;
    return false;
}

/* A registration for a rank already registered: a retry from its own connection, its own
 * process on a new connection (proven by the token of its welcome), or anyone else, refused. */
static void reg_again(fl_coord_t *c, const fl_tp_msg_t *m, const char *host)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    const fl_tp_route_t *to = &m->route;
    int r = reg->rank;
    coord_rank_t *k = &c->ranks[r];
    if (fl_coord_same_route(&k->route, to) && strcmp(k->key, m->peer_key) == 0) {
        if (c->phase == PHASE_RUNNING)
            send_welcome(c, to); /* a retry after a lost welcome: answer the asker */
        return;
    }
    /* A registered rank is bound to its connection and, with CURVE, to its client key. Only
     * its own process may move it to a new connection (it lost us and opened another), and it
     * proves that with the token its welcome carried, however long the rank was quiet: host
     * and pid prove nothing, and a stall shorter than the heartbeat timeout is no reason to
     * hand the rank over. A rank that left or was declared dead holds nothing any more. */
    int64_t quiet = fl_now_ms() - fl_tp_live_last(c->live, r);
    if (!k->left && fl_tp_live_state(c->live, r) != FL_PEER_DEAD &&
        strcmp(k->key, m->peer_key) == 0 && fl_coord_token_ok(k->token, reg->token)) {
        FL_WARN(c->ctx,
                "rank %d (%s, pid %d) registered again on a new connection with its token, its "
                "old one quiet for %lld ms",
                r, host, reg->pid, (long long)quiet);
        k->route = *to;
        fl_tp_live_heard(c->live, r, fl_now_ms());
        if (c->phase == PHASE_RUNNING)
            send_welcome(c, to);
        return;
    }
    fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
    char holder[FL_HOST_MAX];
    fl_coord_warn(c,
                  "refused a registration for rank %d from host %s (pid %d): %s; the rank is "
                  "held by host %s (pid %d), heard from %lld ms ago",
                  r, host, reg->pid,
                  reg->token[0] ? "its token is not the rank's" : "it gave no token",
                  fl_text_escape(k->reg.host, holder, sizeof holder), k->reg.pid, (long long)quiet);
    /* Nothing about the holder, nor the generation: only what was wrong with this message. */
    fl_coord_send_refusal(c, to, FL_EINVAL, r, reg->host,
                          "rank %d is already registered by another process; this registration "
                          "(host %s, pid %d) is refused: only the holder may register it again, "
                          "giving the token of its welcome",
                          r, reg->host, reg->pid);
}

/* A new rank during the rendezvous must agree with the members already registered: the
 * model, the parameter count, the settings. False when it was refused or failed the
 * rendezvous. */
static bool reg_agrees(fl_coord_t *c, const fl_tp_msg_t *m)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    const fl_tp_route_t *to = &m->route;
    int r = reg->rank;
    if (c->phase == PHASE_RUNNING) {
        fl_coord_refuse(c, to, r, reg->host, "rank %d (host %s) registered after job '%s' started",
                        r, reg->host, c->job_id);
        return false;
    }
    if (c->phase != PHASE_RENDEZVOUS && c->ran) {
        /* Not why: a job that ran failed over a member (its host and pid, what it did), and a
         * stranger learns nothing of members. */
        fl_coord_refuse(c, to, r, reg->host,
                        "rank %d (host %.64s) registered after job '%.64s' failed", r, reg->host,
                        c->job_id);
        return false;
    }
    if (c->phase != PHASE_RENDEZVOUS) {
        /* A rendezvous that failed: a rank late to it learns why, and the job never ran. */
        char failed[FL_SERVICE_TEXT_MAX];
        fl_service_text(&c->svc, failed, sizeof failed);
        fl_coord_refuse(c, to, r, reg->host,
                        "rank %d (host %.64s) registered after job '%.64s' failed: "
                        "%.380s",
                        r, reg->host, c->job_id, failed);
        return false;
    }
    char who[FL_HOST_MAX + 32];
    char why[FL_MSG_TEXT_MAX];
    const fl_msg_register_t *differs = NULL;
    if (fl_coord_check_model(c, reg, &differs, why, sizeof why) != FL_OK) {
        fail_rendezvous(c, to, r, reg->host, why); /* whichever side differs */
        return false;
    }
    snprintf(who, sizeof who, "rank %d (host %s)", r, reg->host);
    if (reg->param_count != 0 &&
        fl_coord_ps_check_params(c, reg->param_count, who, why, sizeof why) != FL_OK) {
        fl_coord_refuse(c, to, r, reg->host, "%s", why);
        return false;
    }
    if (fl_coord_check_agree(c, r, reg, why, sizeof why) != FL_OK) {
        fail_rendezvous(c, to, r, reg->host, why);
        return false;
    }
    return true;
}

/* Takes a rank in: bound to this connection and key from now on. */
static void take_reg(fl_coord_t *c, const fl_tp_msg_t *m, const char *host)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    int r = reg->rank;
    coord_rank_t *k = &c->ranks[r];
    k->registered = true;
    k->left = false;
    k->route = m->route;
    snprintf(k->key, sizeof k->key, "%s", m->peer_key);
    k->reg = *reg;
    k->reg.shard_eps = NULL; /* checked empty (reg_fits_job); the message owns its tables */
    k->reg.nshard_eps = 0;
    k->reg.token[0] = '\0'; /* a token of another coordinator proves nothing here */
    fl_coord_token_new(c, k->token);
    k->waiting_on = -1;
    fl_tp_live_heard(c->live, r, fl_now_ms());
    atomic_fetch_add(&c->nactive, 1);
    int n = atomic_fetch_add(&c->nregistered, 1) + 1;
    char ep[FL_ENDPOINT_MAX];
    FL_INFO(c->ctx, "rank %d registered from %s (pid %d, data %s): %d of %d", r, host, reg->pid,
            fl_text_escape(reg->nendpoints > 0 ? reg->endpoints[0] : "none", ep, sizeof ep), n,
            c->world);
    fl_coord_maybe_start(c);
}

static void on_register(fl_coord_t *c, fl_tp_msg_t *m)
{
    if (!fl_coord_key_fits(c, m))
        return;
    if (m->hdr.u.reg.role == FL_ROLE_SERVER) {
        fl_coord_ps_on_register(c, m);
        return;
    }
    /* Text from the wire is wire text (proto/ refuses any other), and escaped where it is
     * logged all the same: a log line is never written by a peer. */
    char host[FL_HOST_MAX];
    fl_text_escape(m->hdr.u.reg.host, host, sizeof host);
    if (!reg_fits_job(c, m, host))
        return;
    coord_rank_t *k = &c->ranks[m->hdr.u.reg.rank];
    if (!k->heard) {
        k->heard = true;
        atomic_fetch_sub(&c->nunheard, 1);
    }
    if (k->registered)
        reg_again(c, m, host);
    else if (reg_agrees(c, m))
        take_reg(c, m, host);
}

static void on_heartbeat(fl_coord_t *c, fl_tp_msg_t *m, int r)
{
    coord_rank_t *k = &c->ranks[r];
    const fl_msg_heartbeat_t *hb = &m->hdr.u.heartbeat;
    if (hb->op != k->op || hb->op_seq != k->op_seq || hb->op_step != k->op_step ||
        k->progress_ms == 0)
        k->progress_ms = fl_now_ms();
    k->op = m->hdr.u.heartbeat.op;
    k->op_seq = m->hdr.u.heartbeat.op_seq;
    k->op_step = m->hdr.u.heartbeat.op_step;
    k->waiting_on = m->hdr.u.heartbeat.waiting_on;
}

static void check_all_gone(fl_coord_t *c)
{
    if (c->phase == PHASE_RENDEZVOUS || c->nleft + c->ndead < c->world)
        return;
    if (c->phase == PHASE_FAILED) {
        FL_INFO(c->ctx, "all %d ranks gone; job '%s' failed", c->world, c->job_id);
        return;
    }
    int after = -1; /* a rank that left after a failure no rank reported as its own */
    for (int r = 0; r < c->world && after < 0; r++)
        after = c->ranks[r].leave_code != 0 ? r : -1;
    if (c->ndead == 0 && after >= 0) {
        char text[FL_MSG_TEXT_MAX];
        snprintf(text, sizeof text, "all %d ranks left, rank %d after a failure: %.400s", c->world,
                 after, c->ranks[after].leave_text);
        job_failed(c, FL_EPEER, FL_EPEER, after, c->ranks[after].reg.host, text);
        return;
    }
    if (c->ndead == 0) {
        FL_INFO(c->ctx, "all %d ranks left; job '%s' done", c->world, c->job_id);
        if (c->nshards > 0) {
            fl_msg_hdr_t h;
            fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, -1);
            h.u.shutdown.code = 0;
            snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text,
                     "job '%s' is over: all %d ranks left", c->job_id, c->world);
            fl_coord_ps_send_all(c, &h);
        }
        fl_coord_finish(c, FL_OK, "all ranks left cleanly");
    }
}

void fl_coord_fail_job(fl_coord_t *c, int about, const char *text)
{
    coord_rank_t *k = &c->ranks[about];
    for (int r = 0; r < c->world; r++) {
        coord_rank_t *q = &c->ranks[r];
        if (r == about || !q->registered || q->left || fl_tp_live_state(c->live, r) == FL_PEER_DEAD)
            continue;
        fl_coord_send_error(c, &q->route, FL_EPEER, about, k->reg.host, "%s", text);
    }
    job_failed(c, FL_EPEER, FL_EPEER, about, k->reg.host, text);
}

static void on_shutdown(fl_coord_t *c, fl_tp_msg_t *m, int r)
{
    coord_rank_t *k = &c->ranks[r];
    char host[FL_HOST_MAX];
    char said[FL_MSG_TEXT_MAX];
    if (k->left)
        return;
    fl_text_escape(k->reg.host, host, sizeof host);
    k->left = true;
    k->token[0] = '\0'; /* gone: nobody is this rank any more */
    k->leave_code = m->hdr.u.shutdown.code;
    snprintf(k->leave_text, sizeof k->leave_text, "%s", m->hdr.u.shutdown.text);
    atomic_fetch_sub(&c->nactive, 1);
    fl_tp_live_gone(c->live, r);
    if (c->phase == PHASE_RENDEZVOUS) {
        /* Left before the job started: free the slot for a restarted process. */
        k->registered = false;
        atomic_fetch_sub(&c->nregistered, 1);
        fl_tp_live_forget(c->live, r);
        FL_INFO(c->ctx, "rank %d (%s) left before the job started", r, host);
        return;
    }
    c->nleft++;
    if (k->leave_code < 0 && c->phase == PHASE_RUNNING) {
        /* Its own error (a negative fl_err_t: fl_comm_abort): the others would wait for it
         * until their deadline and then blame whoever they waited on. They hear it now, with
         * its reason. A goodbye "after a failure" (code 1) is a collective's failure that the
         * others meet in their own collectives, each naming the peer it waited for. */
        char text[FL_MSG_TEXT_MAX];
        /* Its goodbye may fill a message text alone: the head of it is what matters. */
        snprintf(text, sizeof text, "rank %d (host %.64s, pid %d) failed: %.400s", r, k->reg.host,
                 k->reg.pid, k->leave_text);
        FL_ERROR(c->ctx, "%s", fl_text_escape(text, said, sizeof said));
        k->failed = true;
        fl_coord_fail_job(c, r, text);
        return;
    }
    FL_INFO(c->ctx, "rank %d (%s) left: %s", r, host,
            fl_text_escape(m->hdr.u.shutdown.text, said, sizeof said));
    check_all_gone(c);
}

void fl_coord_on_message(fl_coord_t *c, fl_tp_msg_t *m)
{
    if (m->nframes != 0) {
        fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
        fl_coord_send_refusal(c, &m->route, FL_EPROTO, m->hdr.sender, "",
                              "coordinator: %s message with %zu payload frames refused "
                              "(control messages carry none)",
                              fl_msg_type_name(m->hdr.type), m->nframes);
        return;
    }
    if (m->hdr.type == FL_MSG_REGISTER) {
        if (c->ps_lost) {
            /* Members registering again after the parameter server was lost: they belong to
             * the coordinator that replaces this one. */
            fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
            return;
        }
        on_register(c, m);
        return;
    }
    int slot = fl_coord_ps_slot_of_route(c, &m->route);
    if (slot >= 0 && strcmp(c->servers[slot].key, m->peer_key) == 0) {
        fl_coord_ps_on_message(c, m, slot);
        return;
    }
    int r = rank_of_route(c, &m->route);
    /* A peer may choose its routing id: with CURVE the key it authenticated with must be the
     * rank's too, or it is not that rank. */
    if (r >= 0 && strcmp(c->ranks[r].key, m->peer_key) != 0)
        r = -1;
    if (r < 0 || r != m->hdr.sender) {
        fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
        if (m->hdr.type == FL_MSG_HEARTBEAT && r < 0)
            return; /* a rank dropped during the rendezvous, still beating: not worth a reply */
        fl_coord_send_refusal(c, &m->route, FL_EPROTO, m->hdr.sender, "",
                              "coordinator: %s message from an unregistered peer claiming "
                              "rank %d",
                              fl_msg_type_name(m->hdr.type), m->hdr.sender);
        return;
    }
    if (fl_tp_live_state(c->live, r) == FL_PEER_DEAD)
        return; /* declared dead already: the job is failing, late words change nothing */
    /* Every message of a member, not only its registration, belongs to this job: the job id,
     * and this generation once the member has it (0 before its welcome). Refused otherwise,
     * and it does not count as a sign of life. */
    if (strcmp(m->hdr.job_id, c->job_id) != 0 ||
        (m->hdr.generation != 0 && m->hdr.generation != c->generation)) {
        fl_ctx_count(c->ctx, FL_STAT_BAD_JOB, 1);
        fl_coord_send_error(c, &m->route, FL_EPROTO, r, c->ranks[r].reg.host,
                            "coordinator: %s message from rank %d of job '%s' "
                            "generation %llu refused: this is job '%s' generation %llu",
                            fl_msg_type_name(m->hdr.type), r, m->hdr.job_id,
                            (unsigned long long)m->hdr.generation, c->job_id,
                            (unsigned long long)c->generation);
        return;
    }
    fl_tp_live_heard(c->live, r, fl_now_ms());
    switch (m->hdr.type) {
    case FL_MSG_HEARTBEAT: on_heartbeat(c, m, r); return;
    case FL_MSG_SHUTDOWN: on_shutdown(c, m, r); return;
    default:
        fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
        fl_coord_send_error(c, &m->route, FL_EPROTO, r, "",
                            "coordinator: unexpected %s message from rank %d",
                            fl_msg_type_name(m->hdr.type), r);
        return;
    }
}
