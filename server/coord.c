/* The coordinator's lifecycle: options, bind, its thread (poll the ROUTER socket and the stop
 * pipe, run the periodic tick), waiting for the job's end, and stopping. */
#include "coord_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

void fl_coord_opts_init(fl_coord_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->job_id = "flodl";
    o->heartbeat_timeout_ms = 5000;
    o->heartbeat_ms = 0;
    o->rendezvous_timeout_ms = 300000;
    o->stall_report_ms = 60000;
    o->log_level = FL_LOG_INFO;
}

static int check_opts(const fl_coord_opts_t *o)
{
    fl_tp_endpoint_t ep;
    /* First, before any other field is read: a struct of another size has other fields. */
    if (o->struct_size != sizeof *o)
        return fl_fail(FL_EINVAL,
                       "coordinator: fl_coord_opts_t.struct_size is %zu, this libflodl %s "
                       "expects %zu: fill the options with fl_coord_opts_init",
                       o->struct_size, FL_VERSION_STRING, sizeof *o);
    if (o->bind == NULL)
        return fl_fail(FL_EINVAL, "coordinator: no bind endpoint given");
    if (o->stall_report_ms < 0)
        return fl_fail(FL_EINVAL, "coordinator: stall_report_ms %d is negative",
                       o->stall_report_ms);
    if (fl_tp_endpoint_parse(o->bind, &ep) != FL_OK)
        return fl_fail_ctx(FL_EINVAL, "coordinator: bind");
    if (o->world_size < 1 || o->world_size > FL_MSG_MAX_PEERS)
        return fl_fail(FL_EINVAL, "coordinator: world_size %d out of range 1..%d", o->world_size,
                       FL_MSG_MAX_PEERS);
    if (o->job_id == NULL || o->job_id[0] == '\0' || strlen(o->job_id) >= FL_JOB_MAX)
        return fl_fail(FL_EINVAL, "coordinator: job_id must be 1..%d bytes", FL_JOB_MAX - 1);
    if (fl_text_scan(o->job_id, strlen(o->job_id), NULL) != strlen(o->job_id))
        return fl_fail(FL_EINVAL, "coordinator: job_id must be UTF-8 without control characters");
    if (o->heartbeat_timeout_ms < 10)
        return fl_fail(FL_EINVAL, "coordinator: heartbeat_timeout_ms %d below 10",
                       o->heartbeat_timeout_ms);
    if (o->heartbeat_ms < 0 || (o->heartbeat_ms > 0 && o->heartbeat_ms >= o->heartbeat_timeout_ms))
        return fl_fail(FL_EINVAL, "coordinator: heartbeat_ms %d must be below the timeout %d",
                       o->heartbeat_ms, o->heartbeat_timeout_ms);
    if (o->rendezvous_timeout_ms < 1)
        return fl_fail(FL_EINVAL, "coordinator: rendezvous_timeout_ms must be positive");
    if (o->num_shards < 0 || o->num_shards > FL_MSG_MAX_SHARDS)
        return fl_fail(FL_EINVAL, "coordinator: num_shards %d out of range 0..%d", o->num_shards,
                       FL_MSG_MAX_SHARDS);
    if (o->param_count > 0 && o->num_shards == 0)
        return fl_fail(FL_EINVAL, "coordinator: param_count given without num_shards");
    return FL_OK;
}

static uint64_t new_generation(void)
{
    uint64_t g = (uint64_t)fl_now_ns() ^ ((uint64_t)getpid() << 40);
    FILE *f = fopen("/dev/urandom", "rb");
    if (f != NULL) {
        uint64_t r;
        if (fread(&r, sizeof r, 1, f) == 1)
            g ^= r;
        fclose(f);
    }
    return g ? g : 1;
}

void fl_coord_token_new(fl_coord_t *c, char token[FL_MSG_TOKEN_MAX])
{
    uint8_t r[(FL_MSG_TOKEN_MAX - 1) / 2];
    token[0] = '\0';
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        /* Without a token the member cannot move to a new connection; it still runs. */
        FL_ERROR(c->ctx, "no random bytes for a member's token: %s", strerror(errno));
        return;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof r; i++) {
        token[2 * i] = hex[r[i] >> 4];
        token[2 * i + 1] = hex[r[i] & 15];
    }
    token[2 * sizeof r] = '\0';
}

bool fl_coord_token_ok(const char *held, const char *given)
{
    size_t n = strlen(held);
    if (n == 0 || strnlen(given, FL_MSG_TOKEN_MAX) != n)
        return false;
    /* Every byte looked at, whatever differs first: the time says nothing of the token. */
    unsigned diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)(held[i] ^ given[i]);
    return diff == 0;
}

bool fl_coord_key_fits(fl_coord_t *c, const fl_tp_msg_t *m)
{
    const fl_msg_register_t *reg = &m->hdr.u.reg;
    int b = m->peer_bound;
    bool server = reg->role == FL_ROLE_SERVER;
    if (b == FL_TP_KEY_ANY || (server ? b == FL_TP_KEY_SERVER : b == reg->rank))
        return true;
    char claim[64];
    char owner[64];
    if (server)
        snprintf(claim, sizeof claim, "a parameter-server process");
    else
        snprintf(claim, sizeof claim, "rank %d", reg->rank);
    if (b == FL_TP_KEY_SERVER)
        snprintf(owner, sizeof owner, "the parameter-server processes");
    else
        snprintf(owner, sizeof owner, "rank %d", b);
    fl_ctx_count(c->ctx, FL_STAT_AUTH_REFUSED, 1);
    /* The key's own binding is all the asker learns: it holds that key already. */
    fl_coord_refuse(c, &m->route, server ? -1 : reg->rank, reg->host,
                    "a registration as %s (host %s) came with the client key of %s: with "
                    "per-member keys each member registers with its own",
                    claim, reg->host, owner);
    return false;
}

int fl_coord_create(const fl_coord_opts_t *o, fl_coord_t **out)
{
    *out = NULL;
    int rc = check_opts(o);
    if (rc != FL_OK)
        return rc;
    fl_coord_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fl_fail(FL_ENOMEM, "coordinator: out of memory");
    pthread_mutex_init(&c->lock, NULL);
    fl_service_init(&c->svc);
    snprintf(c->job_id, sizeof c->job_id, "%s", o->job_id);
    c->world = o->world_size;
    atomic_store(&c->nunheard, o->world_size);
    fl_ratelimit_init(&c->warn_rl, FL_COORD_WARN_BURST, FL_COORD_WARN_WINDOW_MS);
    c->hb_timeout_ms = o->heartbeat_timeout_ms;
    c->stall_ms = o->stall_report_ms;
    c->hb_ms = o->heartbeat_ms > 0 ? o->heartbeat_ms : o->heartbeat_timeout_ms / 5;
    if (c->hb_ms < 1)
        c->hb_ms = 1;
    c->rdv_timeout_ms = o->rendezvous_timeout_ms;
    c->generation = new_generation();
    c->nshards = o->num_shards;
    c->init_params = o->param_count;

    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = o->log_level;
    co.log_name = "coordinator";
    co.max_msg_bytes = FL_COORD_MAX_MSG;
    if ((rc = fl_ctx_create(&co, &c->ctx)) != FL_OK ||
        (rc = fl_tp_curve_use(c->ctx, o->curve_dir, NULL)) != FL_OK)
        goto fail;
    c->ranks = calloc((size_t)c->world, sizeof *c->ranks);
    c->rank_info = calloc((size_t)c->world, sizeof *c->rank_info);
    c->info.world = c->world;
    if (c->ranks == NULL || c->rank_info == NULL) {
        rc = fl_fail(FL_ENOMEM, "coordinator: out of memory for %d ranks", c->world);
        goto fail;
    }
    if (c->nshards > 0 && (c->servers = calloc((size_t)c->nshards, sizeof *c->servers)) == NULL) {
        rc = fl_fail(FL_ENOMEM, "coordinator: out of memory for %d shards", c->nshards);
        goto fail;
    }
    if ((rc = fl_tp_live_create(c->world + c->nshards, c->hb_timeout_ms, &c->live)) != FL_OK)
        goto fail;

    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 1000;
    /* Every member may be in its handshake at once, all from one address (one big host, pods
     * behind SNAT): the cap per address is the job's size plus the default's margin. */
    t.pending_per_addr = c->world + c->nshards + 32;
    /* A member's DEALER keeps its routing id across ZeroMQ's reconnects (tp_join.c): its new
     * connection takes over the old one, which may not have been seen to end yet (a path that
     * died silently). Whoever presents a member's id takes its route, so flodl's are 16
     * random bytes, sent only in the member's own handshake (encrypted under CURVE). */
    t.router_handover = true;
    /* Every member may connect at once: past the kernel's queue of connections not yet
     * accepted (ZeroMQ's 100), the rest wait for TCP to send their SYN again, up to 31 s. */
    t.backlog = t.pending_per_addr;
    char bound[FL_ENDPOINT_MAX];
    if ((rc = fl_tp_sock_create(c->ctx, FL_TP_ROUTER, &t, "coordinator", &c->sock)) != FL_OK ||
        (rc = fl_tp_sock_bind(c->sock, o->bind, bound, sizeof bound)) != FL_OK)
        goto fail;
    fl_tp_sock_set_stamp(c->sock, c->job_id, c->generation, -1);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", bound);

    fl_tp_opts_t p;
    fl_tp_opts_init(&p);
    p.linger_ms = 0;
    if ((rc = fl_tp_sock_create(c->ctx, FL_TP_PAIR, &p, "stop", &c->cmd_rx)) != FL_OK ||
        (rc = fl_tp_sock_bind(c->cmd_rx, "inproc://flodl-coord-stop", NULL, 0)) != FL_OK ||
        (rc = fl_tp_sock_create(c->ctx, FL_TP_PAIR, &p, "stop", &c->cmd_tx)) != FL_OK ||
        (rc = fl_tp_sock_connect(c->cmd_tx, "inproc://flodl-coord-stop")) != FL_OK)
        goto fail;
    *out = c;
    return FL_OK;
fail:
    fl_coord_destroy(&c);
    return rc;
}

const char *fl_coord_endpoint(const fl_coord_t *c)
{
    return c->endpoint;
}

uint64_t fl_coord_stat(const fl_coord_t *c, fl_stat_t stat)
{
    return fl_ctx_stat(c->ctx, stat);
}

int fl_coord_set_held_max(fl_coord_t *c, size_t bytes)
{
    return fl_ctx_set_held_max(c->ctx, bytes);
}

int fl_coord_registered(const fl_coord_t *c)
{
    return atomic_load(&((fl_coord_t *)c)->nregistered);
}

int fl_coord_active(const fl_coord_t *c)
{
    return atomic_load(&((fl_coord_t *)c)->nactive);
}

int fl_coord_unheard(const fl_coord_t *c)
{
    return atomic_load(&((fl_coord_t *)c)->nunheard);
}

int fl_coord_servers_active(const fl_coord_t *c)
{
    return atomic_load(&((fl_coord_t *)c)->nservers_active);
}

void fl_coord_finish(fl_coord_t *c, int rc, const char *text)
{
    fl_service_finish(&c->svc, rc, text);
}

/* Tells every member still connected that the coordinator stops, so none waits for it. */
static void say_goodbye(fl_coord_t *c)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, -1);
    h.u.shutdown.code = 1;
    snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text,
             "coordinator %s stopped before the job ended", c->endpoint);
    fl_coord_send_all(c, &h);
}

static void *coord_main(void *arg)
{
    fl_coord_t *c = arg;
    fl_tp_sock_t *socks[2] = {c->sock, c->cmd_rx};
    int64_t next_tick = 0;
    c->started_ms = fl_now_ms();
    FL_INFO(c->ctx, "waiting for %d ranks of job '%s' at %s", c->world, c->job_id, c->endpoint);
    for (;;) {
        int64_t now = fl_now_ms();
        if (now >= next_tick) {
            fl_coord_tick(c, now);
            fl_coord_stall_check(c, now);
            fl_coord_publish(c, now);
            next_tick = now + (c->hb_ms / 2 > 0 ? c->hb_ms / 2 : 1);
        }
        bool ready[2] = {false, false};
        int wait = (int)(next_tick - now);
        if (fl_tp_poll(socks, 2, wait > 0 ? wait : 0, ready) < 0) {
            FL_ERROR(c->ctx, "%s", fl_last_error());
            usleep(10000); /* never spin on a failing poll */
            continue;
        }
        if (ready[1])
            break;
        /* Drain what is there, but back to the tick once it is due: heartbeats and liveness go
         * first each turn, whatever one connection sends (a message costs at most a header
         * scan before it is refused). */
        for (int i = 0; ready[0] && i < 256 && (i == 0 || fl_now_ms() < next_tick); i++) {
            fl_tp_msg_t m;
            int rc = fl_tp_recv(c->sock, &m, fl_deadline_in(0));
            if (rc == FL_ETIMEDOUT)
                break;
            if (rc == FL_EPROTO) {
                fl_coord_on_refused(c, &m);
                continue;
            }
            if (rc != FL_OK) {
                FL_ERROR(c->ctx, "%s", fl_last_error());
                break;
            }
            fl_coord_on_message(c, &m);
            fl_tp_msg_close(&m);
        }
    }
    if (!fl_service_is_finished(&c->svc))
        say_goodbye(c);
    fl_coord_finish(c, FL_ECLOSED, "coordinator stopped");
    return NULL;
}

int fl_coord_start(fl_coord_t *c)
{
    return fl_service_start(&c->svc, coord_main, c, "coordinator");
}

int fl_coord_wait(fl_coord_t *c, int timeout_ms)
{
    return fl_service_wait(&c->svc, timeout_ms, "job still running");
}

void fl_coord_outcome(const fl_coord_t *c, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = '\0';
    for (int r = 0; r < c->world && at + 1 < cap; r++) {
        const coord_rank_t *k = &c->ranks[r];
        char one[FL_MSG_TEXT_MAX + 64];
        if (k->refused)
            snprintf(one, sizeof one, "rank %d refused: %s", r, k->leave_text);
        else if (!k->registered)
            snprintf(one, sizeof one, "rank %d never joined", r);
        else if (!c->ran && c->phase == PHASE_FAILED)
            snprintf(one, sizeof one, "rank %d registered; the job did not start", r);
        else if (k->left && k->leave_code == 0)
            snprintf(one, sizeof one, "rank %d done", r);
        else if (k->left && k->failed)
            snprintf(one, sizeof one, "rank %d failed: %s", r, k->leave_text);
        else if (k->left)
            snprintf(one, sizeof one, "rank %d stopped after the job failed", r);
        else if (fl_tp_live_state(c->live, r) == FL_PEER_DEAD)
            snprintf(one, sizeof one,
                     "rank %d dead (host %s: silent past the heartbeat "
                     "timeout)%s",
                     r, k->reg.host, k->failed ? ", which failed the job" : "");
        else
            snprintf(one, sizeof one, "rank %d still running", r);
        int w = snprintf(out + at, cap - at, "%s%s", r > 0 ? "; " : "", one);
        at += w > 0 ? (size_t)w : 0;
    }
}

/* Wakes the coordinator thread through its stop pipe. */
static void wake(void *arg)
{
    fl_coord_t *c = arg;
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, -1);
    fl_tp_send(c->cmd_tx, NULL, &h, NULL, 0, fl_deadline_in(5000));
}

void fl_coord_stop(fl_coord_t *c)
{
    if (c != NULL)
        fl_service_stop(&c->svc, wake, c);
}

static void coord_destroy(fl_coord_t **pc)
{
    if (pc == NULL || *pc == NULL)
        return;
    fl_coord_t *c = *pc;
    fl_coord_stop(c);
    fl_tp_sock_destroy(&c->sock);
    fl_tp_sock_destroy(&c->cmd_rx);
    fl_tp_sock_destroy(&c->cmd_tx);
    fl_ctx_destroy(&c->ctx);
    fl_tp_live_destroy(&c->live);
    free(c->ranks);
    free(c->rank_info);
    fl_coord_ps_free(c);
    pthread_mutex_destroy(&c->lock);
    fl_service_deinit(&c->svc);
    free(c);
    *pc = NULL;
}

void fl_coord_destroy(fl_coord_t **pc)
{
    fl_error_keep_begin();
    coord_destroy(pc);
    fl_error_keep_end();
}
