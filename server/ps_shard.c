/* A parameter-server shard: its ROUTER socket (bound before the rendezvous, so the coordinator
 * can hand its endpoint to the ranks), its configuration and initial parameters (an --init
 * file's range, a checkpoint, or rank 0's first push), and its thread: poll the socket and the
 * command pipe, handle messages (ps_shard_msg.c), answer pulls that became possible or ran
 * out of time, checkpoint when rank 0 asks and when stopping. */
#include "ps_shard_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CMD_STOP = 1, CMD_STOP_CHECKPOINT = 2 };

/* Most messages handled before the periodic work (deadlines, commands) gets a turn. */
#define DRAIN_MAX 64

int fl_ps__shard_create(fl_ctx_t *ctx, uint32_t index, const char *bind, const char *host,
                        ps_shard_t **out)
{
    *out = NULL;
    ps_shard_t *sh = calloc(1, sizeof *sh);
    if (sh == NULL)
        return fl_fail(FL_ENOMEM, "shard %u: out of memory", index);
    sh->ctx = ctx;
    sh->index = index;
    char name[32];
    snprintf(name, sizeof name, "shard %u", index);
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    t.sndhwm = 1 << 16;
    t.rcvhwm = 1 << 16;
    t.router_handover = true;
    /* Pushes and replies are as large as the shard: no smaller limit than the context's. */
    int rc;
    char bound[FL_ENDPOINT_MAX];
    if ((rc = fl_tp_sock_create(ctx, FL_TP_ROUTER, &t, name, &sh->sock)) != FL_OK ||
        (rc = fl_tp_sock_bind(sh->sock, bind, bound, sizeof bound)) != FL_OK ||
        (rc = fl_tp_endpoint_advertise(bound, host, sh->endpoint, sizeof sh->endpoint)) != FL_OK)
        goto fail;
    fl_tp_opts_t p;
    fl_tp_opts_init(&p);
    p.linger_ms = 0;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://flodl-shard-%u-%p", index, (void *)sh);
    if ((rc = fl_tp_sock_create(ctx, FL_TP_PAIR, &p, "shard commands", &sh->cmd_rx)) != FL_OK ||
        (rc = fl_tp_sock_bind(sh->cmd_rx, ep, NULL, 0)) != FL_OK ||
        (rc = fl_tp_sock_create(ctx, FL_TP_PAIR, &p, "shard commands", &sh->cmd_tx)) != FL_OK ||
        (rc = fl_tp_sock_connect(sh->cmd_tx, ep)) != FL_OK)
        goto fail;
    *out = sh;
    return FL_OK;
fail:
    fl_ps__shard_destroy(&sh);
    return fl_fail_ctx(rc, "shard %u", index);
}

const char *fl_ps__shard_endpoint(const ps_shard_t *sh)
{
    return sh->endpoint;
}

int fl_ps__shard_configure(ps_shard_t *sh, const ps_shard_conf_t *conf)
{
    if (sh->configured)
        return fl_fail(FL_EINVAL, "shard %u: configured twice", sh->index);
    sh->conf = *conf;
    sh->conf.state.count = conf->count;
    int world = conf->state.world;
    int rc = fl_ps__state_create(&sh->conf.state, &sh->state);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "shard %u", sh->index);
    if ((rc = fl_cmp_ws_create(&sh->ws)) != FL_OK)
        return rc;
    sh->routes = calloc((size_t)world, sizeof *sh->routes);
    sh->route_known = calloc((size_t)world, sizeof *sh->route_known);
    sh->rx = calloc(1, sizeof *sh->rx);
    if (sh->routes == NULL || sh->route_known == NULL || sh->rx == NULL)
        return fl_fail(FL_ENOMEM, "shard %u: out of memory for %d ranks", sh->index, world);
    fl_tp_sock_set_stamp(sh->sock, conf->job_id, conf->generation, FL_MSG_SENDER_SERVER);
    fl_tp_sock_set_expect(sh->sock, conf->job_id, conf->generation);
    sh->configured = true;
    return FL_OK;
}

int fl_ps__shard_init_params(ps_shard_t *sh, const float *params, uint64_t step)
{
    int rc = fl_ps__state_init(sh->state, params, step);
    return rc == FL_OK ? FL_OK : fl_fail_ctx(rc, "shard %u: initial parameters", sh->index);
}

int fl_ps__shard_resume(ps_shard_t *sh, uint64_t step)
{
    const ps_shard_conf_t *c = &sh->conf;
    ps_ckpt_t ck;
    int rc = fl_ps__ckpt_open(c->ckpt_dir, sh->index, c->num_shards, step, &ck);
    if (rc != FL_OK)
        return rc;
    const ps_ckpt_meta_t *m = &ck.meta;
    if (m->offset != c->offset || m->count != c->count || m->param_count != c->param_count) {
        rc = fl_fail(FL_EPROTO,
                     "checkpoint %s holds parameters %" PRIu64 "+%" PRIu64 " of %" PRIu64
                     ", shard %u of this job holds %" PRIu64 "+%" PRIu64 " of %" PRIu64,
                     ck.path, m->offset, m->count, m->param_count, sh->index, c->offset, c->count,
                     c->param_count);
    } else if (m->opt != c->state.opt.kind) {
        rc = fl_fail(FL_EPROTO, "checkpoint %s was written with optimizer %s, this job runs %s",
                     ck.path, fl_opt_kind_name(m->opt), fl_opt_kind_name(c->state.opt.kind));
    } else {
        if (m->consistency != c->state.consistency)
            FL_WARN(sh->ctx,
                    "shard %u: checkpoint %s was written under %s consistency, the job "
                    "now runs %s",
                    sh->index, ck.path, fl_ps_consistency_name(m->consistency),
                    fl_ps_consistency_name(c->state.consistency));
        rc = fl_ps__state_restore(sh->state, ck.params, ck.buf1, ck.buf2, m->opt_steps, m->version,
                                  ck.clocks, ck.nclocks);
        if (rc != FL_OK)
            rc = fl_fail_ctx(rc, "checkpoint %s", ck.path);
    }
    if (rc == FL_OK)
        FL_INFO(sh->ctx, "shard %u resumed from %s (step %" PRIu64 ", version %" PRIu64 ")",
                sh->index, ck.path, m->step, m->version);
    fl_ps__ckpt_close(&ck);
    return rc;
}

int fl_ps__shard_checkpoint(ps_shard_t *sh, uint64_t step)
{
    const ps_shard_conf_t *c = &sh->conf;
    if (c->ckpt_dir == NULL || !fl_ps__state_ready(sh->state))
        return FL_OK;
    int64_t t0 = fl_now_ms();
    ps_ckpt_meta_t m;
    fl_ps__ckpt_meta_init(&m);
    m.shard = sh->index;
    m.num_shards = c->num_shards;
    m.offset = c->offset;
    m.count = c->count;
    m.param_count = c->param_count;
    m.step = step;
    m.version = fl_ps__state_version(sh->state);
    m.opt = c->state.opt.kind;
    m.consistency = c->state.consistency;
    const float *b1 = NULL, *b2 = NULL;
    const fl_opt_t *opt = fl_ps__state_opt(sh->state);
    if (opt != NULL)
        fl_opt_state(opt, &b1, &b2, &m.opt_steps);
    int rc =
        fl_ps__ckpt_write(c->ckpt_dir, &m, fl_ps__params_data(fl_ps__state_params(sh->state)), b1,
                          b2, fl_ps__state_clocks(sh->state), (size_t)c->state.world, c->keep);
    if (rc != FL_OK) {
        /* Training goes on; the previous checkpoint stays the newest. */
        FL_ERROR(sh->ctx, "shard %u: checkpoint of step %" PRIu64 " failed: %s", sh->index, step,
                 fl_last_error());
        return rc;
    }
    atomic_fetch_add(&sh->n_ckpt, 1);
    sh->last_ckpt_ms = fl_now_ms();
    FL_INFO(sh->ctx, "shard %u: checkpoint of step %" PRIu64 " written in %lld ms", sh->index, step,
            (long long)(sh->last_ckpt_ms - t0));
    return FL_OK;
}

void fl_ps__shard_error(ps_shard_t *sh, const fl_tp_route_t *to, int code, int about,
                        const char *fmt, ...)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, FL_MSG_SENDER_SERVER);
    h.seq = sh->reply_seq;
    h.u.error.code = code;
    h.u.error.about_rank = about;
    int n = snprintf(h.u.error.text, sizeof h.u.error.text, "shard %u: ", sh->index);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof h.u.error.text)
        vsnprintf(h.u.error.text + n, sizeof h.u.error.text - (size_t)n, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&sh->n_refused, 1);
    FL_DEBUG(sh->ctx, "%s", h.u.error.text);
    if (fl_tp_send(sh->sock, to, &h, NULL, 0, fl_deadline_in(0)) == FL_OK)
        fl_ctx_count(sh->ctx, FL_STAT_ERRORS_SENT, 1);
}

const char *fl_ps__shard_rank_name(const ps_shard_t *sh, int rank, char *buf, size_t cap)
{
    if (rank >= 0 && rank < sh->conf.state.world && sh->conf.peers != NULL)
        snprintf(buf, cap, "rank %d (%s)", rank, sh->conf.peers[rank].host);
    else
        snprintf(buf, cap, "rank %d", rank);
    return buf;
}

/* The checkpoint of a stopping shard, labelled as rank 0 labels the periodic ones (sync: the
 * steps applied; async and SSP: rank 0's steps), and not rewriting a label that exists (in
 * sync the same state; otherwise an earlier moment other shards may also hold). It prunes to
 * --keep like the others: the shards may be stopping at different steps, but keep >= 2 leaves
 * the newest periodic checkpoint, the step they all hold, next to it. */
static void final_checkpoint(ps_shard_t *sh)
{
    if (sh->conf.ckpt_dir == NULL || !fl_ps__state_ready(sh->state))
        return;
    uint64_t label = sh->conf.state.consistency == FL_PS_SYNC ? fl_ps__state_min_clock(sh->state)
                                                              : fl_ps__state_clock(sh->state, 0);
    uint64_t have[256];
    size_t n = 0;
    if (fl_ps__ckpt_list(sh->conf.ckpt_dir, sh->index, sh->conf.num_shards, have, 256, &n, NULL) ==
        FL_OK)
        for (size_t i = 0; i < n; i++)
            if (have[i] == label)
                return;
    fl_ps__shard_checkpoint(sh, label);
}

/* Returns true when the thread must end. */
static bool on_command(ps_shard_t *sh)
{
    fl_tp_msg_t c;
    if (fl_tp_recv(sh->cmd_rx, &c, fl_deadline_in(0)) != FL_OK)
        return false;
    bool stop = false;
    if (c.hdr.type == FL_MSG_ERROR) {
        if (sh->failed[0] == '\0') {
            snprintf(sh->failed, sizeof sh->failed, "%s", c.hdr.u.error.text);
            sh->failed_code = c.hdr.u.error.code < 0 ? c.hdr.u.error.code : FL_EPEER;
            fl_ps__shard_fail_pending(sh);
        }
    } else if (c.hdr.type == FL_MSG_SHUTDOWN) {
        if (c.hdr.u.shutdown.code == CMD_STOP_CHECKPOINT)
            final_checkpoint(sh);
        stop = true;
    }
    fl_tp_msg_close(&c);
    return stop;
}

static void *shard_main(void *arg)
{
    ps_shard_t *sh = arg;
    fl_tp_sock_t *socks[2] = {sh->sock, sh->cmd_rx};
    for (;;) {
        int64_t now = fl_now_ms();
        int64_t next = fl_ps__shard_next_deadline(sh);
        int wait = next == INT64_MAX ? 1000 : (int)(next > now ? next - now : 0);
        bool ready[2] = {false, false};
        if (fl_tp_poll(socks, 2, wait > 1000 ? 1000 : wait, ready) < 0) {
            FL_ERROR(sh->ctx, "shard %u: %s", sh->index, fl_last_error());
            usleep(10000); /* never spin on a failing poll */
            continue;
        }
        if (ready[1] && on_command(sh))
            break;
        for (int i = 0; ready[0] && i < DRAIN_MAX; i++) {
            int rc = fl_tp_try_recv(sh->sock, sh->rx);
            if (rc == FL_ETIMEDOUT)
                break;
            if (rc == FL_EPROTO) {
                fl_ps__shard_on_refused(sh);
                continue;
            }
            if (rc != FL_OK) {
                FL_ERROR(sh->ctx, "shard %u: %s", sh->index, fl_last_error());
                break;
            }
            fl_ps__shard_on_message(sh);
            if (sh->rx == NULL && (sh->rx = calloc(1, sizeof *sh->rx)) == NULL) {
                FL_ERROR(sh->ctx, "shard %u: out of memory for a message", sh->index);
                usleep(10000);
                break;
            }
        }
        fl_ps__shard_serve_pending(sh, fl_now_ms());
    }
    return NULL;
}

int fl_ps__shard_start(ps_shard_t *sh)
{
    if (!sh->configured)
        return fl_fail(FL_EINVAL, "shard %u: start before configure", sh->index);
    sh->last_ckpt_ms = fl_now_ms();
    if (pthread_create(&sh->thread, NULL, shard_main, sh) != 0)
        return fl_fail(FL_EIO, "shard %u: cannot start its thread", sh->index);
    sh->started = true;
    return FL_OK;
}

void fl_ps__shard_fail(ps_shard_t *sh, int code, const char *text)
{
    if (!sh->started)
        return;
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, FL_MSG_SENDER_SERVER);
    h.u.error.code = code;
    snprintf(h.u.error.text, sizeof h.u.error.text, "%s", text);
    fl_tp_send(sh->cmd_tx, NULL, &h, NULL, 0, fl_deadline_in(1000));
}

void fl_ps__shard_stop(ps_shard_t *sh, bool final_checkpoint)
{
    if (sh == NULL || !sh->started)
        return;
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, FL_MSG_SENDER_SERVER);
    h.u.shutdown.code = final_checkpoint ? CMD_STOP_CHECKPOINT : CMD_STOP;
    if (fl_tp_send(sh->cmd_tx, NULL, &h, NULL, 0, fl_deadline_in(5000)) != FL_OK)
        FL_ERROR(sh->ctx, "shard %u: could not stop its thread: %s", sh->index, fl_last_error());
    pthread_join(sh->thread, NULL);
    sh->started = false;
}

void fl_ps__shard_get_stats(const ps_shard_t *sh, ps_shard_stats_t *out)
{
    ps_shard_t *s = (ps_shard_t *)sh;
    memset(out, 0, sizeof *out);
    out->pushes = atomic_load(&s->n_push);
    out->pulls = atomic_load(&s->n_pull);
    out->refused = atomic_load(&s->n_refused);
    out->checkpoints = atomic_load(&s->n_ckpt);
    out->timeouts = atomic_load(&s->n_timeouts);
    if (!sh->started && sh->state != NULL) {
        out->version = fl_ps__state_version(sh->state);
        out->step = fl_ps__state_ready(sh->state) ? fl_ps__state_min_clock(sh->state) : 0;
    }
}

static void ps_shard_destroy(ps_shard_t **psh)
{
    if (psh == NULL || *psh == NULL)
        return;
    ps_shard_t *sh = *psh;
    fl_ps__shard_stop(sh, false);
    fl_tp_sock_destroy(&sh->sock);
    fl_tp_sock_destroy(&sh->cmd_rx);
    fl_tp_sock_destroy(&sh->cmd_tx);
    /* After the socket: ZeroMQ has dropped (linger 0) every reply still queued, so their
     * references are gone and the state's parameters can go. */
    if (sh->lz4 != NULL)
        fl_ps__lz4_release(NULL, sh->lz4);
    fl_ps__state_destroy(&sh->state);
    fl_cmp_ws_destroy(&sh->ws);
    if (sh->rx != NULL)
        fl_tp_msg_close(sh->rx);
    free(sh->rx);
    free(sh->pending);
    free(sh->routes);
    free(sh->route_known);
    free(sh);
    *psh = NULL;
}

void fl_ps__shard_destroy(ps_shard_t **psh)
{
    fl_error_keep_begin();
    ps_shard_destroy(psh);
    fl_error_keep_end();
}
