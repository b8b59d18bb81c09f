/* The parameter-server client: registration (a rank without data endpoints that declares its
 * parameter count), the shard map from the welcome (checked: it must cover the model exactly
 * once), one connection per shard, and the public calls. When the coordinator goes away and a
 * restarted one welcomes the rank again (the membership reconnects), the client takes the new
 * map, and the next call joins the training again where the server resumed: FL_ERESYNC. */
#include "ps_client_int.h"
#include "member_opts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 300000
#define DEFAULT_RECONNECT_MS 600000
#define MAX_RESYNCS 8 /* restarts survived within one call before giving up */

void fl_ps_client_opts_init(fl_ps_client_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->rank = -1;
    o->world_size = -1;
    o->job_id = "flodl";
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->rendezvous_timeout_ms = DEFAULT_TIMEOUT_MS;
    o->reconnect_timeout_ms = DEFAULT_RECONNECT_MS;
    o->values = FL_FLOAT32;
    o->log_level = FL_LOG_WARN;
    o->tune_malloc = 1;
}

static const char *env_get(const char *name, void *ud)
{
    (void)ud;
    return getenv(name);
}

int fl_ps_client_opts_from_env(fl_ps_client_opts_t *o)
{
    static _Thread_local fl_launch_info_t info; /* the strings must outlive this call */
    int rc = fl_launch_from_env(env_get, NULL, &info);
    if (rc != FL_OK)
        return rc;
    if (info.rank >= 0)
        o->rank = info.rank;
    if (info.world_size > 0)
        o->world_size = info.world_size;
    if (info.coordinator[0] != '\0')
        o->coordinator = info.coordinator;
    if (info.host[0] != '\0')
        o->host = info.host;
    if (info.job_id[0] != '\0')
        o->job_id = info.job_id;
    if (info.log_level >= 0)
        o->log_level = (fl_log_level_t)info.log_level;
    return FL_OK;
}

static int check_opts(const fl_ps_client_opts_t *o)
{
    /* First, before any other field is read: a struct of another size has other fields. */
    if (o->struct_size != sizeof *o)
        return fl_fail(FL_EINVAL,
                       "ps client: fl_ps_client_opts_t.struct_size is %zu, this libflodl %s "
                       "expects %zu: fill the options with fl_ps_client_opts_init",
                       o->struct_size, FL_VERSION_STRING, sizeof *o);
    int rc = fl_member_opts_check("ps client", o->rank, o->world_size, o->coordinator, o->job_id,
                                  o->host, o->settings);
    if (rc != FL_OK)
        return rc;
    if (o->param_count == 0)
        return fl_fail(FL_EINVAL, "ps client: rank %d: param_count is 0", o->rank);
    if (o->timeout_ms < 1 || o->rendezvous_timeout_ms < 1 || o->reconnect_timeout_ms < 0)
        return fl_fail(FL_EINVAL, "ps client: timeouts must be positive (reconnect: >= 0)");
    if (o->values != FL_FLOAT32 && o->values != FL_FLOAT16 && o->values != FL_BFLOAT16)
        return fl_fail(FL_EINVAL,
                       "ps client: values must be float32, float16 or bfloat16, not "
                       "%s",
                       fl_dtype_name(o->values));
    if (o->log_level < FL_LOG_DEBUG || o->log_level > FL_LOG_OFF)
        return fl_fail(FL_EINVAL, "ps client: log_level %d out of range", (int)o->log_level);
    return FL_OK;
}

int fl_psc__break(fl_ps_client_t *cl, int rc)
{
    if (cl->broken_rc == FL_OK) {
        cl->broken_rc = rc;
        snprintf(cl->broken_text, sizeof cl->broken_text, "%s", fl_last_error());
    }
    return rc;
}

/* Closes the shard connections, dropping what is queued on them, and frees their buffers once
 * ZeroMQ has let go of every frame that points into them (its I/O thread releases the dropped
 * ones shortly after the close). Should that take more than 10 s the buffers are kept, never
 * freed under a reader. */
static void close_shards(fl_ps_client_t *cl)
{
    for (int s = 0; s < cl->nshards; s++) {
        cl_shard_t *sh = &cl->shards[s];
        if (sh->sock != NULL) {
            fl_tp_sock_set_linger(sh->sock, 0);
            fl_tp_sock_destroy(&sh->sock);
        }
    }
    bool held = !fl_rel_wait(&cl->inflight, 10000);
    if (held)
        FL_ERROR(cl->ctx,
                 "rank %d: ZeroMQ still holds %lld pushes 10 s after their sockets "
                 "closed; keeping their buffers",
                 cl->o.rank, (long long)fl_rel_held(&cl->inflight));
    for (int s = 0; s < cl->nshards && !held; s++) {
        free(cl->shards[s].stage);
        free(cl->shards[s].rel_idx);
    }
    free(cl->shards);
    cl->shards = NULL;
    cl->nshards = 0;
}

int fl_psc__reset_shards(fl_ps_client_t *cl)
{
    for (int s = 0; s < cl->nshards; s++) {
        cl_shard_t *sh = &cl->shards[s];
        if (sh->sock != NULL) {
            fl_tp_sock_set_linger(sh->sock, 0);
            fl_tp_sock_destroy(&sh->sock);
        }
    }
    return fl_psc__connect_shards(cl);
}

int fl_psc__connect_shards(fl_ps_client_t *cl)
{
    for (int s = 0; s < cl->nshards; s++) {
        cl_shard_t *sh = &cl->shards[s];
        if (sh->count == 0)
            continue;
        fl_tp_opts_t t;
        fl_tp_opts_init(&t);
        t.linger_ms = 0;
        /* A reply is the shard's parameters, possibly beyond the context's default limit. */
        t.max_msg_bytes = (size_t)sh->count * sizeof(float) + ((size_t)1 << 20);
        char id[96], name[48];
        snprintf(id, sizeof id, "r%d.p%d.g%llx.s%u", cl->o.rank, (int)getpid(),
                 (unsigned long long)cl->generation, sh->index);
        t.routing_id = id;
        snprintf(name, sizeof name, "shard %u", sh->index);
        int rc = fl_tp_sock_create(cl->ctx, FL_TP_DEALER, &t, name, &sh->sock);
        if (rc == FL_OK)
            rc = fl_tp_sock_connect(sh->sock, sh->endpoint);
        if (rc != FL_OK)
            return fl_fail_ctx(rc, "rank %d: connect to shard %u (%s)", cl->o.rank, sh->index,
                               sh->host);
        fl_tp_sock_set_stamp(sh->sock, cl->job_id, cl->generation, cl->o.rank);
        fl_tp_sock_set_expect(sh->sock, cl->job_id, cl->generation);
    }
    return FL_OK;
}

int fl_psc__take_welcome(fl_ps_client_t *cl, fl_msg_hdr_t *h)
{
    const fl_msg_welcome_t *w = &h->u.welcome;
    int r = cl->o.rank;
    if (w->nshards == 0)
        return fl_fail(FL_EINVAL,
                       "rank %d: job '%s' has no parameter server (the coordinator "
                       "runs with 0 shards)",
                       r, cl->job_id);
    if (w->param_count != cl->o.param_count)
        return fl_fail(FL_EINVAL,
                       "rank %d: the parameter server holds %" PRIu64 " parameters, "
                       "this rank's model %zu",
                       r, w->param_count, cl->o.param_count);
    uint64_t next = 0;
    for (uint32_t i = 0; i < w->nshards; i++) {
        const fl_msg_shard_t *s = &w->shards[i];
        if (s->index != i || s->offset != next || (s->count > 0 && s->endpoint[0] == '\0'))
            return fl_fail(FL_EPROTO,
                           "rank %d: the coordinator's shard map is broken at shard "
                           "%u (index %u, parameters %" PRIu64 "+%" PRIu64 ")",
                           r, i, s->index, s->offset, s->count);
        next += s->count;
    }
    if (next != w->param_count)
        return fl_fail(FL_EPROTO,
                       "rank %d: the shard map covers %" PRIu64 " of %" PRIu64 " parameters", r,
                       next, w->param_count);
    close_shards(cl);
    cl->shards = calloc(w->nshards, sizeof *cl->shards);
    if (cl->shards == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: out of memory for %u shards", r, w->nshards);
    cl->nshards = (int)w->nshards;
    for (uint32_t i = 0; i < w->nshards; i++) {
        cl_shard_t *d = &cl->shards[i];
        d->index = i;
        d->offset = w->shards[i].offset;
        d->count = w->shards[i].count;
        memcpy(d->endpoint, w->shards[i].endpoint, sizeof d->endpoint);
        memcpy(d->host, w->shards[i].host, sizeof d->host);
    }
    cl->generation = h->generation;
    cl->n = w->param_count;
    cl->lo = 0;
    cl->hi = w->param_count;
    cl->consistency = (fl_ps_consistency_t)w->consistency;
    cl->staleness = w->staleness;
    cl->ckpt_every_steps = w->ckpt_every_steps;
    cl->ckpt_every_ms = w->ckpt_every_ms;
    return fl_psc__connect_shards(cl);
}

int fl_psc__on_event(fl_ps_client_t *cl)
{
    fl_tp_msg_t ev;
    if (fl_tp_recv(cl->events, &ev, fl_deadline_in(0)) != FL_OK)
        return FL_OK;
    int rc = FL_OK;
    switch (ev.hdr.type) {
    case FL_MSG_SHUTDOWN:
        if (ev.hdr.u.shutdown.code == FL_TP_MEMBER_LOST) {
            /* The control thread has logged it already. */
            cl->lost = true;
            break;
        }
        rc = fl_psc__break(cl, fl_fail(FL_ECLOSED, "rank %d: the coordinator ended the job: %s",
                                       cl->o.rank, ev.hdr.u.shutdown.text));
        break;
    case FL_MSG_WELCOME:
        rc = fl_psc__take_welcome(cl, &ev.hdr);
        if (rc != FL_OK) {
            fl_psc__break(cl, rc);
            break;
        }
        cl->lost = false;
        cl->resync_pending = true;
        cl->stats.resyncs++;
        FL_WARN(cl->ctx, "rank %d: rejoined the restarted parameter server (%d shards)", cl->o.rank,
                cl->nshards);
        rc = FL_ERESYNC;
        break;
    case FL_MSG_ERROR:
        rc = fl_psc__break(cl, fl_fail(ev.hdr.u.error.code < 0 ? ev.hdr.u.error.code : FL_EPEER,
                                       "rank %d: %s", cl->o.rank, ev.hdr.u.error.text));
        break;
    default: break;
    }
    fl_tp_msg_close(&ev);
    return rc;
}

int fl_psc__wait_rejoin(fl_ps_client_t *cl)
{
    /* The membership gives up at its reconnect deadline and says so: this is a backstop. */
    int64_t deadline = fl_deadline_in(cl->o.reconnect_timeout_ms + 30000);
    while (cl->lost) {
        bool ready = false;
        fl_tp_sock_t *ev = cl->events;
        /* The time before the look: at the deadline the poll still takes a welcome that came
         * in the last slice. */
        int left = fl_deadline_left_ms(deadline);
        if (fl_tp_poll(&ev, 1, left > 1000 ? 1000 : left, &ready) > 0 && ready) {
            int rc = fl_psc__on_event(cl);
            if (rc != FL_OK)
                return rc;
        } else if (left == 0) {
            return fl_psc__break(cl, fl_fail(FL_ETIMEDOUT,
                                             "rank %d: the parameter server did not "
                                             "come back within %d ms",
                                             cl->o.rank, cl->o.reconnect_timeout_ms));
        }
    }
    return FL_ERESYNC;
}

int fl_ps_client_create(const fl_ps_client_opts_t *o, fl_ps_client_t **out)
{
    *out = NULL;
    int rc = check_opts(o);
    if (rc != FL_OK)
        return rc;
    fl_ps_client_t *cl = calloc(1, sizeof *cl);
    if (cl == NULL)
        return fl_fail(FL_ENOMEM, "ps client: out of memory");
    if (o->tune_malloc)
        fl_malloc_tune();
    cl->o = *o;
    snprintf(cl->coordinator, sizeof cl->coordinator, "%s", o->coordinator);
    snprintf(cl->job_id, sizeof cl->job_id, "%s", o->job_id);
    cl->o.coordinator = cl->coordinator;
    cl->o.job_id = cl->job_id;
    cl->o.host = NULL;
    cl->o.settings = NULL;     /* the registration keeps its own copy */
    cl->o.model_shapes = NULL; /* read by the registration below only */
    cl->last_mark_ms = fl_now_ms();

    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = o->log_level;
    char name[64];
    snprintf(name, sizeof name, "rank %d", o->rank);
    co.log_name = name;
    char self[32]; /* a key of this rank's own, where the job has per-rank keys */
    snprintf(self, sizeof self, "rank-%d", o->rank);
    if ((rc = fl_ctx_create(&co, &cl->ctx)) != FL_OK ||
        (rc = fl_tp_curve_use(cl->ctx, o->curve_dir, self)) != FL_OK)
        goto fail;
    if (o->host != NULL)
        snprintf(cl->host, sizeof cl->host, "%s", o->host);
    else if ((rc = fl_tp_local_addr_towards(o->coordinator, cl->host, sizeof cl->host)) != FL_OK)
        goto fail;
    if ((rc = fl_cmp_ws_create(&cl->ws)) != FL_OK)
        goto fail;

    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = cl->coordinator;
    mo.job_id = cl->job_id;
    mo.name = name;
    mo.sender = o->rank;
    mo.rendezvous_timeout_ms = o->rendezvous_timeout_ms;
    mo.reconnect_timeout_ms = o->reconnect_timeout_ms;
    if ((rc = fl_tp_member_create(cl->ctx, &mo, &cl->member)) != FL_OK)
        goto fail;
    cl->events = fl_tp_member_events(cl->member);
    cl->status = fl_tp_member_status(cl->member);

    fl_msg_register_t reg;
    memset(&reg, 0, sizeof reg);
    reg.role = FL_ROLE_WORKER;
    reg.rank = o->rank;
    reg.world_size = o->world_size;
    snprintf(reg.host, sizeof reg.host, "%s", cl->host);
    reg.pid = (int32_t)getpid();
    reg.model_signature = o->model_signature;
    if (o->model_shapes != NULL && o->model_shapes[0] != '\0') {
        reg.model_signature = fl_model_shapes_signature(o->model_shapes);
        fl_model_shapes_cut(o->model_shapes, reg.model_shapes, sizeof reg.model_shapes);
    }
    reg.param_count = o->param_count;
    snprintf(reg.tuning, sizeof reg.tuning, "ps");
    snprintf(reg.settings, sizeof reg.settings, "%s", o->settings ? o->settings : "");
    fl_msg_hdr_t welcome;
    if ((rc = fl_tp_member_join(cl->member, &reg, &welcome)) != FL_OK)
        goto fail;
    rc = fl_psc__take_welcome(cl, &welcome);
    fl_msg_hdr_deinit(&welcome);
    if (rc != FL_OK)
        goto fail;
    char full[FL_HOST_MAX + 32];
    snprintf(full, sizeof full, "rank %d %s", o->rank, cl->host);
    fl_ctx_set_log_name(cl->ctx, full);
    if ((rc = fl_tp_member_start(cl->member)) != FL_OK)
        goto fail;
    FL_INFO(cl->ctx, "joined job '%s' as rank %d of %d: %d shards, %s", cl->job_id, o->rank,
            o->world_size, cl->nshards, fl_ps_consistency_name(cl->consistency));
    *out = cl;
    return FL_OK;
fail:
    fl_ps_client_destroy(&cl);
    return rc;
}

void fl_ps_client_abort(fl_ps_client_t *cl, int code, const char *why)
{
    if (cl == NULL || cl->aborted)
        return;
    cl->aborted = true;
    cl->abort_rc = code < 0 ? code : FL_EIO; /* negative: the coordinator passes it on */
    snprintf(cl->abort_text, sizeof cl->abort_text, "%s", why != NULL ? why : "");
}

/* A part's end: its sends released, its own buffers freed; the connections stay the
 * parent's. Pushes still queued when the parameter server was lost (on their way to it when it
 * died; the part's call returned FL_ERESYNC without waiting for them) would stay on those
 * connections until the parent rejoins, which it does only after its parts are gone: so the
 * part's connections are closed here (dropping what is queued; ZeroMQ's I/O thread then lets
 * go of it) and opened again for the parent. Should ZeroMQ still hold a send after 10 s, the
 * part and every buffer a send may point into are kept, never freed under it. */
static void destroy_part(fl_ps_client_t *cl)
{
    if (!fl_rel_wait(&cl->inflight, 100)) {
        FL_INFO(cl->ctx, "rank %d part %d: dropping %lld pushes queued to the parameter server",
                cl->o.rank, cl->part, (long long)fl_rel_held(&cl->inflight));
        if (fl_psc__reset_shards(cl) != FL_OK)
            FL_WARN(cl->ctx, "rank %d part %d: reconnecting its shards: %s", cl->o.rank, cl->part,
                    fl_last_error());
    }
    atomic_fetch_sub(&cl->parent->nparts, 1);
    if (!fl_rel_wait(&cl->inflight, 10000)) {
        FL_ERROR(cl->ctx,
                 "rank %d part %d: ZeroMQ still holds %lld pushes 10 s after their "
                 "connections closed; keeping their buffers",
                 cl->o.rank, cl->part, (long long)fl_rel_held(&cl->inflight));
        /* The stage buffers hang off the parent's shards, which the parent's rejoin frees:
         * taken from them, they are kept with the part. */
        for (int s = 0; s < cl->nshards; s++) {
            cl->shards[s].stage = NULL;
            cl->shards[s].stage_cap = 0;
            cl->shards[s].rel_idx = NULL;
            cl->shards[s].rel_cap = 0;
        }
        return;
    }
    for (int s = 0; s < cl->nshards; s++) {
        free(cl->shards[s].stage);
        free(cl->shards[s].rel_idx);
        cl->shards[s].stage = NULL;
        cl->shards[s].stage_cap = 0;
        cl->shards[s].rel_idx = NULL;
        cl->shards[s].rel_cap = 0;
    }
    fl_cmp_ws_destroy(&cl->ws);
    free(cl);
}

int fl_ps_client_split(fl_ps_client_t *cl, int part, int parts, fl_ps_client_t **out)
{
    *out = NULL;
    if (cl->parent != NULL)
        return fl_fail(FL_EINVAL, "rank %d: a part of a client cannot be split again", cl->o.rank);
    if (parts < 1 || parts > cl->nshards || part < 0 || part >= parts)
        return fl_fail(FL_EINVAL,
                       "rank %d: part %d of %d: the parameter server has %d shards "
                       "(1 <= parts <= shards)",
                       cl->o.rank, part, parts, cl->nshards);
    if (cl->broken_rc != FL_OK)
        return fl_fail(FL_ECLOSED,
                       "rank %d: parameter-server client broken by an earlier "
                       "failure: %s",
                       cl->o.rank, cl->broken_text);
    if (atomic_load(&cl->nparts) == 0)
        atomic_store(&cl->parts_stop, 0); /* the parts of a new split start afresh */
    if (!cl->have_mark_mu) {
        pthread_mutex_init(&cl->mark_mu, NULL);
        cl->have_mark_mu = true;
        cl->mark_step = UINT64_MAX;
    }
    fl_ps_client_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: out of memory for part %d", cl->o.rank, part);
    int first = (int)((long)part * cl->nshards / parts);
    int end = (int)((long)(part + 1) * cl->nshards / parts);
    p->o = cl->o;
    p->o.coordinator = cl->coordinator;
    p->o.job_id = cl->job_id;
    memcpy(p->coordinator, cl->coordinator, sizeof p->coordinator);
    memcpy(p->job_id, cl->job_id, sizeof p->job_id);
    memcpy(p->host, cl->host, sizeof p->host);
    p->ctx = cl->ctx;
    p->status = cl->status;
    p->generation = cl->generation;
    p->n = cl->n;
    p->consistency = cl->consistency;
    p->staleness = cl->staleness;
    p->ckpt_every_steps = cl->ckpt_every_steps;
    p->ckpt_every_ms = cl->ckpt_every_ms;
    p->shards = cl->shards + first;
    p->nshards = end - first;
    p->lo = p->shards[0].offset;
    p->hi = p->shards[p->nshards - 1].offset + p->shards[p->nshards - 1].count;
    p->step = cl->step;
    /* Requests numbered after the parent's: a late answer to one of its requests on these
     * connections is never taken for the part's. */
    p->seq = cl->seq + ((uint64_t)(part + 1) << 40);
    p->broken_rc = FL_OK;
    p->parent = cl;
    p->part = part;
    int rc = fl_cmp_ws_create(&p->ws);
    if (rc != FL_OK) {
        free(p);
        return rc;
    }
    atomic_fetch_add(&cl->nparts, 1);
    *out = p;
    return FL_OK;
}

void fl_ps_client_part_range(const fl_ps_client_t *cl, size_t *offset, size_t *count)
{
    *offset = (size_t)cl->lo;
    *count = (size_t)(cl->hi - cl->lo);
}

static void ps_client_destroy(fl_ps_client_t **pcl)
{
    if (pcl == NULL || *pcl == NULL)
        return;
    fl_ps_client_t *cl = *pcl;
    if (cl->parent != NULL) {
        destroy_part(cl);
        *pcl = NULL;
        return;
    }
    if (atomic_load(&cl->nparts) > 0)
        FL_ERROR(cl->ctx, "rank %d: destroyed before its %d parts", cl->o.rank,
                 atomic_load(&cl->nparts));
    if (cl->member != NULL) {
        /* Cleanly, on its own error (passed on to the others), or after another's failure. */
        char text[FL_MSG_TEXT_MAX];
        int code = cl->aborted ? cl->abort_rc : cl->broken_rc != FL_OK ? 1 : 0;
        if (cl->aborted)
            snprintf(text, sizeof text, "%.440s (at step %llu)", cl->abort_text,
                     (unsigned long long)cl->step);
        else
            snprintf(text, sizeof text, "rank %d leaves after %llu steps%s", cl->o.rank,
                     (unsigned long long)cl->step,
                     cl->broken_rc != FL_OK ? " (after a failure)" : "");
        fl_tp_member_stop(cl->member, code, text);
    }
    close_shards(cl);
    fl_tp_member_destroy(&cl->member);
    fl_cmp_ws_destroy(&cl->ws);
    fl_ctx_destroy(&cl->ctx);
    if (cl->have_mark_mu)
        pthread_mutex_destroy(&cl->mark_mu);
    free(cl);
    *pcl = NULL;
}

void fl_ps_client_destroy(fl_ps_client_t **pcl)
{
    fl_error_keep_begin();
    ps_client_destroy(pcl);
    fl_error_keep_end();
}

size_t fl_ps_client_param_count(const fl_ps_client_t *cl)
{
    return (size_t)cl->n;
}

int fl_ps_client_num_shards(const fl_ps_client_t *cl)
{
    return cl->nshards;
}

fl_ps_consistency_t fl_ps_client_consistency(const fl_ps_client_t *cl)
{
    return cl->consistency;
}

int fl_ps_client_staleness(const fl_ps_client_t *cl)
{
    return (int)cl->staleness;
}

uint64_t fl_ps_client_step(const fl_ps_client_t *cl)
{
    return cl->step;
}

void fl_ps_client_get_stats(const fl_ps_client_t *cl, fl_ps_client_stats_t *out)
{
    *out = cl->stats;
}

/* Joins (again): rank 0 offers params, everyone takes the shards' parameters and step. Each
 * restart met on the way starts it over. */
static int join_training(fl_ps_client_t *cl, float *params, bool *resynced)
{
    for (int tries = 0; tries < MAX_RESYNCS; tries++) {
        int rc = fl_psc__exchange(cl, NULL, cl->o.rank == 0, params, true);
        /* SSP: the ranks' clocks may be apart (a checkpoint keeps them as they were); the
         * parameters for this rank's step come within the staleness bound, or its next push
         * would be beyond it. */
        if (rc == FL_OK && cl->consistency == FL_PS_SSP)
            rc = fl_psc__exchange(cl, NULL, false, params, false);
        if (rc != FL_ERESYNC) {
            if (rc == FL_OK)
                cl->resync_pending = false;
            return rc;
        }
        *resynced = true;
    }
    return fl_psc__break(cl, fl_fail(FL_EPEER,
                                     "rank %d: the parameter server restarted %d times "
                                     "while this rank joined it",
                                     cl->o.rank, MAX_RESYNCS));
}

int fl_ps_client_init(fl_ps_client_t *cl, float *params)
{
    bool resynced = false;
    return join_training(cl, params, &resynced);
}

int fl_ps_client_push(fl_ps_client_t *cl, const fl_ps_grad_t *grad)
{
    if (cl->resync_pending)
        return fl_fail(FL_ERESYNC,
                       "rank %d: the parameter server restarted: pull its "
                       "parameters, then go on from step %llu",
                       cl->o.rank, (unsigned long long)cl->step);
    return fl_psc__exchange(cl, grad, false, NULL, false);
}

int fl_ps_client_pull(fl_ps_client_t *cl, float *params)
{
    bool resynced = false;
    if (cl->parent != NULL)
        return fl_psc__exchange(cl, NULL, false, params, false);
    /* Its parts heard the coordinator go (they stop with FL_ERESYNC): wait for its successor. */
    if (cl->lost) {
        int w = fl_psc__wait_rejoin(cl);
        if (w != FL_ERESYNC)
            return w;
    }
    if (cl->resync_pending)
        return join_training(cl, params, &resynced);
    int rc = fl_psc__exchange(cl, NULL, false, params, false);
    if (rc != FL_ERESYNC)
        return rc;
    rc = join_training(cl, params, &resynced);
    return rc == FL_OK ? fl_fail(FL_ERESYNC,
                                 "rank %d: the parameter server restarted; going "
                                 "on from step %llu",
                                 cl->o.rank, (unsigned long long)cl->step)
                       : rc;
}

int fl_ps_client_push_pull(fl_ps_client_t *cl, const fl_ps_grad_t *grad, float *params)
{
    bool resynced = cl->resync_pending;
    int rc = FL_ERESYNC;
    if (!cl->resync_pending)
        rc = fl_psc__exchange(cl, grad, false, params, false);
    if (rc != FL_ERESYNC || cl->parent != NULL)
        return rc; /* a part: its parent joins again (fl_ps_client_split) */
    rc = join_training(cl, params, &resynced);
    return rc == FL_OK ? fl_fail(FL_ERESYNC,
                                 "rank %d: the parameter server restarted; going "
                                 "on from step %llu",
                                 cl->o.rank, (unsigned long long)cl->step)
                       : rc;
}
